"""A locked store costs the writer a bounded wait, on real SQLite (another connection holds BEGIN
EXCLUSIVE) and real PostgreSQL (another transaction holds an ACCESS EXCLUSIVE lock on `responses`): the
batch fails whole after `[store] write_deadline_seconds` (never row by row, once per row), an async
caller gets WriterSlow (or the store's failure) within the deadline, health shows the oldest write's age
and `stalled` meanwhile, and once the lock is gone everything is written again without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time

import pytest
from sqlalchemy.engine import make_url

from liveloop.store import BatchWriter, ResponseRecord, Store, StoreConfig
from liveloop.store.writer import WriterSlow, store_unavailable

DEADLINE = 1.0


def _record(i: int) -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}", api_key_id="key-a", model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2, 3),
        response_ids=(4, 5), behavior_logprobs=(-0.5, -0.5), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
    )


@contextlib.contextmanager
def _locked(url: str):
    """Another client holds the write lock until the block ends."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(make_url(url).database, isolation_level=None, timeout=10)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("LOCK TABLE responses IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


@pytest.fixture
def writer(store_url):
    store = Store(StoreConfig(url=store_url, write_deadline_seconds=DEADLINE, writer_stall_seconds=0.3))
    store.migrate()
    store.versions.ensure_base_version("/models/base")
    w = BatchWriter(store).start()
    yield w
    w.close()
    store.close()


def test_a_locked_store_fails_batches_whole_and_fast_then_recovers(writer):
    url = writer.store.config.url
    with _locked(url):
        started = time.monotonic()
        futures = [writer.submit(_record(i)) for i in range(8)]
        stalled = False
        while not all(f.done() for f in futures) and time.monotonic() - started < 120:  # a hang guard only
            stalled = stalled or writer.health().stalled
            time.sleep(0.05)
        failures = [f.exception(timeout=0) for f in futures]  # raises TimeoutError if any is still waiting
        assert all(exc is not None and store_unavailable(exc) for exc in failures), failures
        # at most a batch or two, each waiting the deadline once (row by row it would be 8 failed commits, 8
        # waits of the busy timeout): counted, not timed, so the verdict does not depend on the machine
        assert 1 <= writer.failed_commits <= 3 and stalled
        health = writer.health()
        assert not health.store_ok and health.queued == 0 and not health.stalled

        async def wait_one() -> float:
            t = time.monotonic()
            with pytest.raises(Exception) as caught:
                await writer.write(_record(100))
            assert isinstance(caught.value, WriterSlow) or store_unavailable(caught.value)
            return time.monotonic() - t

        assert asyncio.run(wait_one()) < 3 * DEADLINE
    # the lock is gone: the same writer writes again, and health recovers
    done = [writer.submit(_record(i)) for i in range(8)]
    assert [f.result(timeout=30) for f in done] == [f"r-{i}" for i in range(8)]
    health = writer.health()
    assert health.store_ok and not health.stalled and health.oldest_age == 0.0
    assert all(writer.store.feedback.get_response(f"r-{i}") is not None for i in range(8))
