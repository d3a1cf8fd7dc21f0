"""The store on real SQLite and real PostgreSQL: migrations, responses with binary token columns,
feedback rules, the batched writer, the learner's read path."""

import asyncio
import dataclasses
import threading

import numpy as np
import pytest
from sqlalchemy import inspect

from liveloop.store import BatchWriter, FeedbackRecord, ResponseNotFound, ResponseRecord, SchemaNotReady, Store, WriterFull
from liveloop.store.config import StoreConfig
from liveloop.store import migrate


def _record(i: int, key: str = "key-a", version: int = 0) -> ResponseRecord:
    return ResponseRecord(
        id=f"chatcmpl-{i}",
        api_key_id=key,
        model="m",
        policy_version=version,
        endpoint="chat",
        prompt_ids=(1, 2, 3),
        response_ids=(7, 8, 9, i),
        behavior_logprobs=(-0.5, -1.25, -2.0, -0.125),
        finish_reason="stop",
        temperature=1.0,
        top_p=1.0,
        latency_ms=12.5,
        request_meta={"topic": "cats"},
    )


def test_unmigrated_database_is_refused(store_url):
    s = Store(StoreConfig(url=store_url))
    with pytest.raises(SchemaNotReady, match="liveloop store migrate"):
        s.require_schema()
    assert s.migrate() == migrate.head_revision()
    s.require_schema()
    tables = set(inspect(s.engine).get_table_names())
    assert {"policy_versions", "responses", "feedback", "learner_cursor"} <= tables
    s.close()


def test_migration_is_idempotent_and_keeps_rows(store):
    store.feedback.insert_responses([_record(1)])
    store.migrate()  # a second upgrade on a live database changes nothing
    assert store.feedback.get_response("chatcmpl-1") is not None


def test_downgrade_then_upgrade(store_url):
    s = Store(StoreConfig(url=store_url))
    s.migrate()
    assert migrate.downgrade(s.engine, "base") is None
    assert "responses" not in inspect(s.engine).get_table_names()
    s.migrate()
    assert "responses" in inspect(s.engine).get_table_names()
    s.close()


def test_response_round_trip_exact(store):
    store.feedback.insert_responses([_record(5)])
    got = store.feedback.get_response("chatcmpl-5")
    assert got.response_ids.tolist() == [7, 8, 9, 5]
    assert got.prompt_ids.tolist() == [1, 2, 3]
    assert got.behavior_logprobs.dtype == np.float32
    assert got.behavior_logprobs.tolist() == [-0.5, -1.25, -2.0, -0.125]
    assert got.action_mask.tolist() == [1, 1, 1, 1]
    assert got.policy_version == 0 and got.request_meta == {"topic": "cats"}


def test_feedback_rules(store):
    store.feedback.insert_responses([_record(1, key="key-a")])
    first = store.feedback.put_feedback(FeedbackRecord("chatcmpl-1", "key-a", 1))
    # another key cannot rate it, and cannot tell it exists
    with pytest.raises(ResponseNotFound):
        store.feedback.put_feedback(FeedbackRecord("chatcmpl-1", "key-b", 0))
    with pytest.raises(ResponseNotFound):
        store.feedback.put_feedback(FeedbackRecord("chatcmpl-404", "key-a", 0))
    # a change of mind updates the one row in place: same id, so a learner that has not reached it
    # trains the new value, and one past it never sees the pair again (ratings train once)
    assert store.feedback.rated_after(0, limit=10)[0][0].reward == 1
    second = store.feedback.put_feedback(FeedbackRecord("chatcmpl-1", "key-a", 0, "changed my mind"))
    assert second.id == first.id and second.revisions == 1
    rows = store.feedback.get_feedback("chatcmpl-1")
    assert [(r.reward, r.comment, r.revisions) for r in rows] == [(0, "changed my mind", 1)]
    assert [(f.reward, r.id) for f, r in store.feedback.rated_after(0, limit=10)] == [(0, "chatcmpl-1")]
    assert store.feedback.rated_after(first.id, limit=10) == []
    for _ in range(20):  # a flood of re-ratings adds no training sample
        store.feedback.put_feedback(FeedbackRecord("chatcmpl-1", "key-a", 1))
    assert store.feedback.rated_after(first.id, limit=10) == []
    assert store.feedback.get_feedback("chatcmpl-1")[0].revisions == 21


def test_batch_isolates_bad_operations(store):
    ops = [_record(1), FeedbackRecord("nope", "key-a", 1), _record(2), FeedbackRecord("chatcmpl-1", "key-a", 1)]
    results = store.feedback.write_batch(ops)
    assert results[0] == "chatcmpl-1" and results[2] == "chatcmpl-2"
    assert isinstance(results[1], ResponseNotFound)
    assert results[3].reward == 1
    # a duplicate id fails alone; the rest of the batch is still written
    results = store.feedback.write_batch([_record(1), _record(3)])
    assert isinstance(results[0], Exception) and results[1] == "chatcmpl-3"
    assert store.feedback.counts()["responses"] == 3


def test_writer_group_commits_concurrent_submissions(store):
    writer = BatchWriter(store, batch_max=64).start()
    n_threads, per_thread = 4, 100
    futures = []
    lock = threading.Lock()

    def submit(t: int) -> None:
        for i in range(per_thread):
            fut = writer.submit(_record(t * 1000 + i))
            with lock:
                futures.append(fut)

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fut in futures:
        fut.result(timeout=30)
    writer.close()
    assert store.feedback.counts()["responses"] == n_threads * per_thread
    assert writer.rows == n_threads * per_thread
    assert writer.batches < writer.rows  # several rows per transaction


def test_writer_close_flushes_queue(store):
    writer = BatchWriter(store).start()
    futures = [writer.submit(_record(i)) for i in range(50)]
    writer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert store.feedback.counts()["responses"] == 50


def test_versions_and_cursor(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/ckpt/1", learner_step=3, samples_used=12, metrics={"learner/loss": 0.5}, status="published")
    assert store.versions.activate_version(1).previous == 0
    assert store.versions.latest_version().version == 1
    assert [v.version for v in store.versions.list_versions()] == [0, 1]
    assert store.versions.get_version(1).metrics == {"learner/loss": 0.5}
    assert store.feedback.get_cursor("sao") == 0
    with store.transaction() as s:
        store.versions.set_cursor("sao", 42, 1, session=s)
    assert store.feedback.get_cursor("sao") == 42


def test_batched_ratings_keep_order_and_replace(store):
    store.feedback.insert_responses([_record(i) for i in range(4)])
    ops = [FeedbackRecord(f"chatcmpl-{i}", "key-a", i % 2) for i in range(4)]
    ops.insert(2, FeedbackRecord("chatcmpl-9", "key-a", 1))  # unknown: fails alone
    results = store.feedback.write_batch(ops)
    ok = [r for r in results if not isinstance(r, Exception)]
    assert [r.response_id for r in ok] == [f"chatcmpl-{i}" for i in range(4)]
    assert [r.id for r in ok] == sorted(r.id for r in ok)  # ids follow submission order
    assert isinstance(results[2], ResponseNotFound)
    # the same key rating the same response twice in one batch: the later rating wins
    results = store.feedback.write_batch([FeedbackRecord("chatcmpl-0", "key-a", 1), FeedbackRecord("chatcmpl-0", "key-a", 0)])
    assert results[1].id == results[0].id == ok[0].id
    assert [(f.reward, f.revisions) for f in store.feedback.get_feedback("chatcmpl-0")] == [(0, 2)]
    # a new pair rated twice in one batch is one row too
    store.feedback.insert_responses([_record(7)])
    results = store.feedback.write_batch([FeedbackRecord("chatcmpl-7", "key-a", 0), FeedbackRecord("chatcmpl-7", "key-a", 1)])
    assert results[0].id == results[1].id
    assert [(f.reward, f.revisions) for f in store.feedback.get_feedback("chatcmpl-7")] == [(1, 1)]


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
def test_extreme_seeds_are_stored(store, seed):
    store.feedback.insert_responses([dataclasses.replace(_record(1), seed=seed)])
    assert store.feedback.get_response("chatcmpl-1").seed == seed


def test_a_row_the_database_cannot_hold_fails_alone(store):
    """A value out of every column's range fails its own operation; the rest of the batch lands."""
    too_big = dataclasses.replace(_record(2), seed=2**64 + 5)
    store.feedback.insert_responses([_record(0)])
    results = store.feedback.write_batch([_record(1), too_big, FeedbackRecord("chatcmpl-0", "key-a", 1), _record(3)])
    assert results[0] == "chatcmpl-1" and results[3] == "chatcmpl-3" and results[2].reward == 1
    assert isinstance(results[1], Exception)
    assert store.feedback.get_response("chatcmpl-2") is None and store.feedback.counts()["responses"] == 3


def test_writer_survives_cancelled_waiters(store):
    """A request that goes away while its write is queued only stops waiting: the record is still
    written once, and the writer keeps serving everyone else (it used to die of InvalidStateError)."""

    async def scenario() -> None:
        writer = BatchWriter(store, batch_max=8).start()
        waiters = [asyncio.ensure_future(writer.write(_record(i))) for i in range(200)]
        await asyncio.sleep(0)
        for w in waiters[::2]:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        # cancelled raw futures (a caller that used submit and cancelled) are skipped, not fatal
        futs = [writer.submit(_record(1000 + i)) for i in range(50)]
        for f in futs[::3]:
            f.cancel()
        assert await writer.write(_record(5000)) == "chatcmpl-5000"
        assert writer.health().alive
        writer.close()

    asyncio.run(scenario())
    ids = {f"chatcmpl-{i}" for i in range(200)} | {"chatcmpl-5000"}
    assert all(store.feedback.get_response(i) is not None for i in ids)
    assert store.feedback.counts()["responses"] >= 201


def test_writer_queue_is_bounded(store):
    """A full queue refuses at once (the edge answers 503 + Retry-After) instead of blocking."""
    writer = BatchWriter(store, batch_max=1, queue_max=4).start()
    accepted, refused = [], 0
    for i in range(500):
        try:
            accepted.append(writer.submit(_record(i)))
        except WriterFull:
            refused += 1
    writer.close()
    assert refused > 0 and writer.rejected == refused
    assert all(f.result(timeout=30) for f in accepted)
    assert store.feedback.counts()["responses"] == len(accepted)
