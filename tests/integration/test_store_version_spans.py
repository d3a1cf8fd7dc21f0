"""Version spans (which policy version sampled which tokens of a response) in the store, on real
SQLite and real PostgreSQL: written by the writer path, read back by every reader of a response,
NULL when absent, refused when malformed, and added by migration 0005 to a live 0004 database."""

import asyncio
from datetime import datetime, timezone

import pytest
from sqlalchemy import column, inspect, table, text

from liveloop.store import BatchWriter, FeedbackRecord, InvalidVersionSpans, ResponseRecord, Store, StoreConfig
from liveloop.store import migrate
from liveloop.store.models import Response
from liveloop.store.feedback import response_row


def _record(i: int, spans=None, n: int = 6) -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}",
        api_key_id="key-a",
        model="m",
        policy_version=1,
        endpoint="chat",
        prompt_ids=(1, 2),
        response_ids=tuple(range(10, 10 + n)),
        behavior_logprobs=tuple(-0.25 * (k + 1) for k in range(n)),
        finish_reason="length",
        temperature=1.0,
        top_p=1.0,
        latency_ms=3.0,
        version_spans=spans,
    )


def _stored_spans(store: Store) -> dict[str, object]:
    with store.engine.connect() as conn:
        return dict(conn.execute(text("SELECT id, version_spans FROM responses")).all())


def test_spans_round_trip_through_the_writer(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/c/1")
    store.versions.add_version(2, parent=1, checkpoint_path="/c/2")
    mixed = ((0, 2, 1), (2, 5, 2), (5, 6, 3))
    writer = BatchWriter(store).start()

    async def scenario() -> None:
        await asyncio.gather(writer.write(_record(1, mixed)), writer.write(_record(2)), writer.write(_record(3, [[0, 6, 2]])))
        await writer.write(FeedbackRecord("r-1", "key-a", 1))
        await writer.write(FeedbackRecord("r-2", "key-a", 0))

    asyncio.run(scenario())
    writer.close()
    assert store.feedback.get_response("r-1").version_spans == mixed
    assert store.feedback.get_response("r-2").version_spans is None
    assert store.feedback.get_response("r-3").version_spans == ((0, 6, 2),)  # lists become tuples of ints
    # the learner's read path carries them too
    by_id = {r.id: r.version_spans for _, r in store.feedback.rated_after(0, limit=10)}
    assert by_id == {"r-1": mixed, "r-2": None}
    # None is SQL NULL, not a JSON null
    with store.engine.connect() as conn:
        nulls = conn.execute(text("SELECT id FROM responses WHERE version_spans IS NULL")).scalars().all()
    assert nulls == ["r-2"]


def test_insert_responses_writes_spans(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/c/1")
    store.feedback.insert_responses([_record(7, ((0, 3, 0), (3, 6, 1)))])
    assert store.feedback.get_response("r-7").version_spans == ((0, 3, 0), (3, 6, 1))


@pytest.mark.parametrize(
    "spans",
    [
        (),  # a non-empty response needs spans that cover it
        ((0, 3, 1),),  # does not reach the end
        ((0, 3, 1), (4, 6, 2)),  # a gap
        ((0, 4, 1), (3, 6, 2)),  # an overlap
        ((1, 6, 1),),  # does not start at 0
        ((0, 0, 1), (0, 6, 2)),  # an empty span
        ((0, 6, 1), (6, 7, 2)),  # past the end
        ((0, 6, -1),),  # no such version
        ((0, 6),),  # not a triple
    ],
)
def test_malformed_spans_are_refused(spans):
    with pytest.raises(InvalidVersionSpans):
        _record(1, spans)


def test_empty_response_may_have_empty_spans():
    assert _record(1, (), n=0).version_spans == ()
    with pytest.raises(InvalidVersionSpans):
        _record(1, ((0, 1, 0),), n=0)


def test_upgrade_from_0004_keeps_rows(store_url):
    """A live 0004 database with responses upgrades to 0005: its rows read back whole, with no spans;
    new rows carry spans; a downgrade drops the column and keeps the rows."""
    s = Store(StoreConfig(url=store_url))
    assert migrate.upgrade(s.engine, "0004") == "0004"
    versions = table("policy_versions", column("version"), column("parent"), column("created_at"), column("checkpoint_path"),
                     column("learner_step"), column("samples_used"), column("metrics"), column("status"), column("pinned"))
    now = datetime.now(timezone.utc)
    with s.engine.begin() as conn:  # what a 0004 server wrote: the columns it had
        conn.execute(versions.insert(), [
            {"version": v, "parent": p, "created_at": now, "checkpoint_path": path, "learner_step": 0, "samples_used": 0,
             "metrics": "{}", "status": status, "pinned": False}
            for v, p, path, status in ((0, None, "/base", "retired"), (1, 0, "/c/1", "serving"))
        ])
    with s.engine.begin() as conn:  # what a 0004 server wrote: the columns it had, no version_spans yet
        had = {c["name"] for c in inspect(conn).get_columns("responses")}
        assert "version_spans" not in had
        old_row = {k: v for k, v in response_row(_record(1), datetime.now(timezone.utc)).items() if k in had}
        conn.execute(table("responses", *(column(k) for k in old_row)).insert(), [old_row])
    assert s.migrate() == migrate.head_revision() and migrate.head_revision() >= "0005"
    got = s.feedback.get_response("r-1")
    assert got.version_spans is None and got.response_ids.tolist() == [10, 11, 12, 13, 14, 15]
    s.feedback.insert_responses([_record(2, ((0, 1, 0), (1, 6, 1)))])
    assert s.feedback.get_response("r-2").version_spans == ((0, 1, 0), (1, 6, 1))
    assert _stored_spans(s)["r-1"] is None
    assert migrate.downgrade(s.engine, "0004") == "0004"
    with s.engine.connect() as conn:
        assert "version_spans" not in {c["name"] for c in inspect(conn).get_columns("responses")}
        assert sorted(conn.execute(text("SELECT id FROM responses")).scalars()) == ["r-1", "r-2"]
    s.close()
