"""Fixtures shared by the integration tests: a started hf engine on the default model (a module that
needs another engine defines its own `engine`, which takes precedence), and the default model's
tokenizer as the exports read it (`text`: liveloop's TokenText, `tok`: the raw `tokenizers` one)."""

from __future__ import annotations

import pytest


@pytest.fixture
async def engine(model_dir):
    """The hf engine serving version 0, with a 5 s drain deadline (what the publisher tests swap)."""
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.hf.engine import HFEngine

    eng = HFEngine(EngineConfig(backend="hf", model=str(model_dir), drain_deadline_seconds=5.0), model_dir)
    await eng.start(version=0)
    yield eng
    await eng.close()


@pytest.fixture(scope="module")
def text(model_dir):
    from liveloop.store.export_text import TokenText

    return TokenText(model_dir)


@pytest.fixture(scope="module")
def tok(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
