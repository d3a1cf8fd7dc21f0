"""Feedback ids are commit order with several writers on one store (server replicas, each with its own
group-commit writer), on real SQLite and real PostgreSQL: a learner reading ratings past its cursor
between interleaved commits never skips one and never reads one twice.

The hazard: ids from a sequence are taken when a transaction inserts, not when it commits. Writer A
takes id 5 and is still committing when writer B takes 6 and commits; the learner reads 6 and moves its
cursor there; A's 5 commits behind the cursor and is never trained. SQLite cannot interleave so (one
writer at a time); PostgreSQL can, and hands ids out from a counter whose row lock is held to commit
(migration 0008), so B waits for A."""

import threading
import time

import pytest
from sqlalchemy import text

from liveloop.store import BatchWriter, FeedbackRecord, ResponseRecord, Store, StoreConfig
from liveloop.store import migrate

CURSOR = "sao"


def _response(i: int, key: str = "k") -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}", api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2),
        response_ids=(i % 50, 7), behavior_logprobs=(-0.5, -0.25), finish_reason="stop", temperature=1.0,
        top_p=1.0, latency_ms=1.0,
    )


class Learner:
    """What the learner does with the store: read the ratings past its stored cursor, in id order, and
    move the cursor to the last one read (`rated_after`, then `advance_cursor`)."""

    def __init__(self, store: Store):
        self.store, self.read = store, []

    def step(self) -> list[int]:
        cursor = self.store.feedback.get_cursor(CURSOR)
        ids = [f.id for f, _ in self.store.feedback.rated_after(cursor, 10_000)]
        if ids:
            assert ids == sorted(ids) and ids[0] > cursor
            self.store.versions.advance_cursor(CURSOR, ids[-1], 0)
        self.read.extend(ids)
        return ids


def _stores(url: str, n: int, **config) -> list[Store]:
    """`n` Store instances on one database (each its own connection pool, as separate processes have)."""
    stores = [Store(StoreConfig(url=url, **config)) for _ in range(n)]
    stores[0].migrate()
    stores[0].versions.ensure_base_version("/models/base")
    return stores


def _all_ids(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM feedback ORDER BY id")).scalars())


def _settle(later, store: Store, seconds: float = 10.0) -> bool:
    """Wait until the second writer either committed (`later` done: what the old scheme allowed) or, on
    PostgreSQL, waits for a lock in the feedback-id counter's UPDATE (it really reached its ids while the
    held transaction had its own); returns whether it was seen waiting. SQLite: its writer waits for
    the write lock at BEGIN IMMEDIATE, which no view shows: a short wait instead."""
    if store.dialect != "postgresql":
        time.sleep(0.3)
        return True
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not later.done():
        with store.engine.connect() as conn:
            waiting = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE feedback_counter%'"
            )).scalar_one()
        if waiting:
            return True
        time.sleep(0.02)
    return False


def test_a_rating_held_open_is_read_after_one_committed_while_it_waited(store_url):
    """Rounds: one writer's transaction takes its ids and is held open (a barrier) while the other
    replica's BatchWriter writes a rating and the learner reads; then the held one commits. The second
    write must not land before the held one (so no larger id is visible while a smaller one can still
    commit); the learner reads every rating once. Then the same interleaving with ids taken as a
    sequence takes them (PostgreSQL): the learner skips the held rating for good."""
    a, b, reader = _stores(store_url, 3, write_deadline_seconds=20.0)
    writers = [BatchWriter(s).start() for s in (a, b)]
    learner = Learner(reader)
    try:
        a.feedback.write_batch([_response(i) for i in range(20)])
        writers[0].submit(FeedbackRecord("r-0", "k", 1)).result(10)
        assert learner.step() == [1]
        for rnd in range(3):
            held, other = (a, writers[1]) if rnd % 2 == 0 else (b, writers[0])
            positioned, release, outcome = threading.Event(), threading.Event(), {}

            def hold(store: Store = held, i: int = 1 + 2 * rnd) -> None:
                with store.db.writing.begin() as conn:  # the writer's own transaction and apply
                    outcome["held"] = store.feedback.apply_batch(conn, [FeedbackRecord(f"r-{i}", "k", 1)], None)[0]
                    positioned.set()
                    release.wait(20)

            thread = threading.Thread(target=hold)
            thread.start()
            try:
                assert positioned.wait(10)
                later = other.submit(FeedbackRecord(f"r-{2 + 2 * rnd}", "k", 0))
                waited = _settle(later, reader)
                assert learner.step() == []  # nothing new is visible: not the held rating, not the later one
                assert not later.done(), "a rating committed while one with a smaller id was still open"
                assert waited, "the second writer never reached its ids while the first held its own"
            finally:
                release.set()
                thread.join(10)
            second = later.result(10)
            assert outcome["held"].id < second.id
            assert learner.step() == [outcome["held"].id, second.id]
        assert learner.read == _all_ids(reader)  # every rating, once, in order
        assert len(set(learner.read)) == len(learner.read) == 7
    finally:
        for w in writers:
            w.close()

    if a.dialect != "postgresql":
        return
    # the old scheme in the same interleaving: ids handed out in the order transactions ask for them
    # (a sequence's nextval), not in commit order
    with reader.engine.begin() as conn:
        last = conn.execute(text("SELECT last_id FROM feedback_counter")).scalar_one()
        conn.execute(text(f"CREATE SEQUENCE old_feedback_ids START {last + 1}"))
    insert = text(
        "INSERT INTO feedback (id, response_id, api_key_id, reward, created_at, revisions) "
        "VALUES (nextval('old_feedback_ids'), :r, 'k', 1, now(), 0) RETURNING id"
    )
    with a.engine.connect() as held_conn:
        held_tx = held_conn.begin()
        first = held_conn.execute(insert, {"r": "r-10"}).scalar_one()  # takes its id, stays open
        with b.engine.begin() as conn:
            second = conn.execute(insert, {"r": "r-11"}).scalar_one()  # a larger id, committed first
        assert learner.step() == [second]  # the cursor moves past `first`, still uncommitted
        held_tx.commit()
    assert first < second and first in _all_ids(reader)
    assert learner.step() == [] and first not in learner.read  # skipped for ever: what 0008 prevents


def test_two_writers_racing_a_reading_learner(store_url):
    """Two replicas' writers rate 2 x 200 responses, alternating, 16 in flight, while the learner reads
    past its cursor in a loop of its own: it reads each rating exactly once, in id order, and the ids
    have no gaps (PostgreSQL's counter rolls back with a failed transaction; nothing fails here)."""
    a, b, reader = _stores(store_url, 3)
    n = 200
    a.feedback.write_batch([_response(i, key="ka" if i < n else "kb") for i in range(2 * n)])
    writers = [BatchWriter(s).start() for s in (a, b)]
    learner = Learner(reader)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            learner.step()

    reading = threading.Thread(target=read)
    reading.start()
    try:
        futures = []
        for i in range(n):  # alternate the replicas, a few in flight
            futures.append(writers[0].submit(FeedbackRecord(f"r-{i}", "ka", 1)))
            futures.append(writers[1].submit(FeedbackRecord(f"r-{n + i}", "kb", 0)))
            if len(futures) >= 16:
                for fut in futures:
                    fut.result(30)
                futures.clear()
        for fut in futures:
            fut.result(30)
    finally:
        stop.set()
        reading.join(30)
        for w in writers:
            w.close()
    learner.step()
    assert learner.read == _all_ids(reader) == list(range(1, 2 * n + 1))


def test_a_deleted_rating_id_is_never_handed_out_again(store):
    """Data rights keep working with the counter: deleting the newest rating (its response) or
    forgetting a key does not let a later rating reuse an id a cursor may already have passed."""
    store.feedback.write_batch([_response(i) for i in range(3)] + [_response(3, key="gone")])
    first = store.feedback.put_feedback(FeedbackRecord("r-0", "k", 1))
    second = store.feedback.put_feedback(FeedbackRecord("r-1", "k", 1))
    gone = store.feedback.put_feedback(FeedbackRecord("r-3", "gone", 0))
    store.versions.advance_cursor(CURSOR, gone.id, 0)
    assert store.rights.delete_response("r-1", "k").ratings == 1
    assert store.rights.forget_key("gone").ratings == 1
    third = store.feedback.put_feedback(FeedbackRecord("r-2", "k", 0))
    assert third.id > gone.id > second.id > first.id
    assert [f.id for f, _ in store.feedback.rated_after(store.feedback.get_cursor(CURSOR), 10)] == [third.id]


def test_the_migration_keeps_ids_and_continues_past_them(store_url):
    """0007 -> head on a store with ratings, the newest one deleted: old ids stay, a cursor on them stays
    valid, and new ratings (the writer's, and on PostgreSQL a plain INSERT through the column default)
    come after every id ever handed out."""
    s = Store(StoreConfig(url=store_url))
    try:
        migrate.upgrade(s.engine, "0007")
        s.versions.ensure_base_version("/models/base")
        with s.engine.begin() as conn:
            for i in range(4):
                conn.execute(text(
                    "INSERT INTO responses (id, api_key_id, model, policy_version, endpoint, prompt_ids, response_ids, "
                    "behavior_logprobs, finish_reason, temperature, top_p, prompt_tokens, completion_tokens, latency_ms, "
                    "created_at) VALUES (:id, 'k', 'm', 0, 'chat', :b, :b, :b, 'stop', 1, 1, 0, 0, 1, CURRENT_TIMESTAMP)"
                ), {"id": f"r-{i}", "b": b""})
            for i in range(3):
                conn.execute(text(
                    "INSERT INTO feedback (response_id, api_key_id, reward, created_at, revisions) "
                    "VALUES (:r, 'k', 1, CURRENT_TIMESTAMP, 0)"
                ), {"r": f"r-{i}"})
            conn.execute(text("DELETE FROM feedback WHERE id = 3"))
        s.migrate()
        assert _all_ids(s) == [1, 2]
        s.versions.advance_cursor(CURSOR, 2, 0)
        new = s.feedback.put_feedback(FeedbackRecord("r-2", "k", 0))
        assert new.id == 4
        if s.dialect == "postgresql":
            with s.engine.begin() as conn:
                plain = conn.execute(text(
                    "INSERT INTO feedback (response_id, api_key_id, reward, created_at, revisions) "
                    "VALUES ('r-3', 'k', 1, now(), 0) RETURNING id"
                )).scalar_one()
            assert plain == 5
            assert s.feedback.put_feedback(FeedbackRecord("r-3", "k", 0)).id == 5  # a change of mind keeps the id
        assert [f.id for f, _ in s.feedback.rated_after(s.feedback.get_cursor(CURSOR), 10)] == _all_ids(s)[2:]
    finally:
        s.close()
