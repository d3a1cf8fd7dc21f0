"""The group-commit writer's guarantees on the bulk write path (Core executemany on SQLite, COPY on
PostgreSQL), on real SQLite and real PostgreSQL: a bad row fails alone and nothing is half-written,
ratings keep submission order across batches, and every future resolves only after its commit (thread
futures and event-loop futures, on several loops at once, and with the database failing)."""

import asyncio
import dataclasses
import threading

import pytest
from sqlalchemy import text

from liveloop.store import BatchWriter, FeedbackRecord, ResponseNotFound, ResponseRecord, Store, StoreConfig


def _record(i: int, key: str = "key-a", version: int = 0, n: int = 4) -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}",
        api_key_id=key,
        model="m",
        policy_version=version,
        endpoint="chat",
        prompt_ids=(1, 2, 3),
        response_ids=tuple(range(i, i + n)),
        behavior_logprobs=tuple(-0.5 * (k + 1) for k in range(n)),
        finish_reason="stop",
        temperature=1.0,
        top_p=1.0,
        latency_ms=12.5,
        request_meta={"topic": "cats"} if i % 2 else None,
    )


def _rows(store: Store, sql: str) -> list:
    with store.engine.connect() as conn:
        return conn.execute(text(sql)).all()


def test_a_bad_row_leaves_no_half_written_batch(store):
    """One batch: good responses, a rating of a response in the same batch, a duplicate id, a row
    the database cannot hold (a seed beyond BIGINT) and one whose version does not exist (a foreign
    key). Each bad one fails alone; every good one is written exactly once, whole."""
    store.feedback.insert_responses([_record(0)])
    batch = [
        _record(1),
        FeedbackRecord("r-1", "key-a", 1),  # rates a response of this very batch
        _record(0),  # duplicate id
        dataclasses.replace(_record(2), seed=2**64 + 5),
        _record(3, version=99),  # no such policy version
        _record(4),
        FeedbackRecord("r-404", "key-a", 0),
    ]
    results = store.feedback.write_batch(batch)
    assert results[0] == "r-1" and results[5] == "r-4"
    assert results[1].response_id == "r-1" and results[1].reward == 1
    assert all(isinstance(results[i], Exception) for i in (2, 3, 4))
    assert isinstance(results[6], ResponseNotFound)
    assert sorted(r for (r,) in _rows(store, "SELECT id FROM responses")) == ["r-0", "r-1", "r-4"]
    assert _rows(store, "SELECT response_id, reward FROM feedback") == [("r-1", 1)]
    got = store.feedback.get_response("r-4")  # the row is whole: every column as submitted
    assert got.response_ids.tolist() == [4, 5, 6, 7]
    assert got.behavior_logprobs.tolist() == [-0.5, -1.0, -1.5, -2.0]
    assert got.prompt_ids.tolist() == [1, 2, 3] and got.request_meta is None and got.latency_ms == 12.5
    assert store.feedback.get_response("r-1").request_meta == {"topic": "cats"}


def test_ratings_keep_submission_order_across_batches(store):
    """Feedback ids follow the order ratings were submitted, batch after batch: the learner's cursor
    reads them in id order."""
    store.feedback.insert_responses([_record(i, key=f"k{i % 3}") for i in range(300)])
    writer = BatchWriter(store, batch_max=37).start()
    order = [(i * 7) % 300 for i in range(300)]  # not the responses' order
    futures = [writer.submit(FeedbackRecord(f"r-{i}", f"k{i % 3}", i % 2)) for i in order]
    stored = [f.result(timeout=60) for f in futures]
    writer.close()
    assert writer.batches > 1
    assert [s.response_id for s in stored] == [f"r-{i}" for i in order]
    ids = [s.id for s in stored]
    assert ids == sorted(ids) and len(set(ids)) == 300
    assert [response.id for _, response in store.feedback.rated_after(0, limit=1000)] == [f"r-{i}" for i in order]


def test_futures_resolve_only_after_commit(store, store_url):
    """A thread future is done only once another connection can read its row."""
    other = Store(StoreConfig(url=store_url))
    seen: list[bool] = []
    done = threading.Event()
    writer = BatchWriter(store, batch_max=16).start()
    futures = [writer.submit(_record(i)) for i in range(64)]
    for i, fut in enumerate(futures):
        fut.add_done_callback(lambda f, i=i: seen.append(other.feedback.get_response(f"r-{i}") is not None))
    futures[-1].add_done_callback(lambda f: done.set())
    assert done.wait(60)
    writer.close()
    other.close()
    assert len(seen) == 64 and all(seen)


def test_event_loop_futures_on_several_loops(store):
    """`write` from two event loops at once: each caller gets its own result, after its commit."""
    writer = BatchWriter(store, batch_max=64).start()
    out: dict[int, list] = {}

    def loop_thread(t: int) -> None:
        async def scenario() -> list:
            ids = await asyncio.gather(*(writer.write(_record(t * 1000 + i)) for i in range(150)))
            visible = [store.feedback.get_response(rid) is not None for rid in ids]
            stored = await writer.write(FeedbackRecord(f"r-{t * 1000}", "key-a", 1))
            return [ids, visible, stored]

        out[t] = asyncio.run(scenario())

    threads = [threading.Thread(target=loop_thread, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    writer.close()
    for t in range(2):
        ids, visible, stored = out[t]
        assert ids == [f"r-{t * 1000 + i}" for i in range(150)] and all(visible)
        assert stored.response_id == f"r-{t * 1000}" and stored.reward == 1
    assert store.feedback.counts()["responses"] == 300 and writer.rows == 302


def test_a_failing_database_fails_every_waiter_then_recovers(store_url):
    """No schema yet: the whole batch fails, every future (thread and event loop) gets the error,
    health says the store is down; once migrated, the same writer commits again."""
    store = Store(StoreConfig(url=store_url))
    writer = BatchWriter(store, batch_max=8).start()

    async def failing() -> list:
        return await asyncio.gather(*(writer.write(_record(i)) for i in range(5)), return_exceptions=True)

    errors = asyncio.run(failing())
    with pytest.raises(Exception):
        writer.submit(_record(9)).result(timeout=30)
    assert len(errors) == 5 and all(isinstance(e, Exception) for e in errors)
    health = writer.health()
    assert health.alive and not health.store_ok and health.failed_commits >= 1 and health.last_error
    store.migrate()
    store.versions.ensure_base_version("/base")
    assert asyncio.run(writer.write(_record(10))) == "r-10"
    assert writer.health().store_ok
    writer.close()
    assert store.feedback.counts()["responses"] == 1
    store.close()


def test_returned_rating_ids_are_the_stored_ones(store):
    """The ids the writer hands back (SQLite derives them without RETURNING) are the rows' ids."""
    store.feedback.insert_responses([_record(i, key=f"k{i % 4}") for i in range(200)])
    store.feedback.write_batch([FeedbackRecord("r-0", "k0", 1)])  # ids do not start at 1
    ops = [FeedbackRecord(f"r-{i}", f"k{i % 4}", i % 2) for i in range(199, 0, -1)]
    ops.insert(50, FeedbackRecord("r-0", "k0", 0))  # a change of mind in the middle
    results = store.feedback.write_batch(ops)
    got = {(r.response_id, r.api_key_id): r.id for r in results}
    stored = {(rid, key): fid for fid, rid, key in _rows(store, "SELECT id, response_id, api_key_id FROM feedback")}
    assert got == stored and len(stored) == 200
    fresh = [r.id for r in results if r.response_id != "r-0"]
    assert fresh == list(range(fresh[0], fresh[0] + 199))  # consecutive, in submission order
