"""Data rights hold for what is not logged yet, on real SQLite and real PostgreSQL: a response deleted
before its row lands (a tombstone) and everything of a forgotten key are dropped by the writer in the
inserting transaction, across a restart of the store and from another Store object (another process's
view); a deletion racing the writer never leaves a row; and on SQLite deleted text is gone from the
database file and its -wal file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from liveloop.store import BatchWriter, FeedbackRecord, ResponseNotFound, ResponseRecord, Store, StoreConfig

SECRET = "zq-unique-deleted-text-7c41"


def _record(rid: str, key: str = "key-a", meta: dict | None = None) -> ResponseRecord:
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2, 3), response_ids=(4, 5),
        behavior_logprobs=(-0.5, -0.25), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0, request_meta=meta,
    )


def _ids(store: Store) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(r for (r,) in conn.execute(text("SELECT id FROM responses")))


def test_a_response_deleted_before_it_lands_is_never_stored(store):
    assert store.rights.delete_response("r-1", "key-a").responses == 0  # not logged yet: a tombstone
    results = store.feedback.write_batch([_record("r-1"), _record("r-2"), _record("r-1b", key="key-b")])
    assert results == ["r-1", "r-2", "r-1b"]  # acknowledged: the deleted one as if stored and deleted
    assert _ids(store) == ["r-1b", "r-2"]
    assert isinstance(store.feedback.write_batch([FeedbackRecord("r-1", "key-a", 1)])[0], ResponseNotFound)
    assert store.feedback.get_feedback("r-1") == []


def test_a_tombstone_matches_only_its_own_key(store):
    store.rights.delete_response("r-x", "key-b")  # another key names this id: nothing of key-a's changes
    store.feedback.write_batch([_record("r-x", key="key-a")])
    assert _ids(store) == ["r-x"]


def test_naming_another_keys_stored_response_writes_nothing(store):
    store.feedback.write_batch([_record("r-y", key="key-a")])
    deleted = store.rights.delete_response("r-y", "key-b")  # not key-b's: no deletion, and no tombstone row
    assert (deleted.responses, deleted.ratings) == (0, 0)
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM deleted_responses")).scalar() == 0
    assert _ids(store) == ["r-y"]


def test_a_forgotten_key_stores_nothing_from_then_on(store):
    store.feedback.write_batch([_record("r-1"), _record("r-2", key="key-b")])
    store.feedback.write_batch([FeedbackRecord("r-1", "key-a", 1)])
    deleted = store.rights.forget_key("key-a")
    assert (deleted.responses, deleted.ratings) == (1, 1)
    results = store.feedback.write_batch([_record("r-3"), FeedbackRecord("r-2", "key-a", 1), _record("r-4", key="key-b")])
    assert results[0] == "r-3" and isinstance(results[1], ResponseNotFound) and results[2] == "r-4"
    assert _ids(store) == ["r-2", "r-4"]
    assert store.feedback.rated_after(0, 10) == []
    assert "key-a" in store.rights.forgotten and "key-b" not in store.rights.forgotten


def test_the_marks_outlive_the_store_object(store_url):
    """A restart (or another process) reads the marks from the database, not from memory."""
    first = Store(StoreConfig(url=store_url))
    first.migrate()
    first.versions.ensure_base_version("/models/base")
    first.rights.delete_response("r-1", "key-a")
    first.rights.forget_key("key-b")
    first.close()
    second = Store(StoreConfig(url=store_url))
    try:
        assert "key-b" not in second.rights.forgotten  # the edge's view is read off the loop, on refresh
        second.rights.forgotten.refresh()
        assert "key-b" in second.rights.forgotten
        second.feedback.write_batch([_record("r-1"), _record("r-2", key="key-b"), _record("r-3")])
        assert _ids(second) == ["r-3"]
    finally:
        second.close()


def test_forgetting_while_the_writer_inserts_never_leaves_a_row(store):
    """The writer inserts batches of key-a's responses while an operator forgets key-a: whatever the
    interleaving, nothing of key-a's is left once both are done."""
    writer = BatchWriter(store, batch_max=8).start()
    stop = threading.Event()
    futures = []

    def traffic() -> None:
        i = 0
        while not stop.is_set() and i < 400:
            futures.append(writer.submit(_record(f"r-{i}")))
            i += 1

    thread = threading.Thread(target=traffic)
    thread.start()
    while len(futures) < 20:
        pass
    store.rights.forget_key("key-a")
    stop.set()
    thread.join()
    for fut in futures:
        fut.result(30)
    writer.close()
    assert _ids(store) == []


def _on_disk(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


@pytest.mark.parametrize("how", ["delete", "forget", "retention"])
def test_deleted_text_leaves_no_bytes_in_the_database_or_its_wal(tmp_path, how):
    from datetime import datetime, timedelta, timezone

    db = tmp_path / "store.db"
    store = Store(StoreConfig(url=f"sqlite:///{db}"))
    store.migrate()
    store.versions.ensure_base_version("/models/base")
    store.feedback.write_batch([_record("r-1", meta={"note": SECRET}), _record("r-2", meta={"note": "kept"})])
    store.feedback.write_batch([FeedbackRecord("r-1", "key-a", 1, comment=SECRET + "-comment")])
    assert SECRET.encode() in _on_disk(db)
    if how == "delete":
        assert store.rights.delete_response("r-1", "key-a").responses == 1
    elif how == "forget":
        store.feedback.write_batch([_record("r-2b", key="key-b")])
        assert store.rights.forget_key("key-a").responses == 2
    else:
        assert store.rights.delete_before(datetime.now(timezone.utc) + timedelta(seconds=1)).responses == 2
    assert SECRET.encode() not in _on_disk(db)
    if how == "delete":
        assert b"kept" in _on_disk(db)  # the check reads the right files
    store.close()
