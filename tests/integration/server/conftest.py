"""Fixtures the publisher tests share: a migrated store on each backend whose version 0 is the tiny
model (rollbacks to it load it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from liveloop.store import Store, StoreConfig


@pytest.fixture
def store(store_url, model_dir):
    s = Store(StoreConfig(url=store_url))
    s.migrate()
    s.ensure_base_version(str(Path(model_dir).resolve()))
    yield s
    s.close()
