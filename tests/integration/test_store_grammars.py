"""A constraint stored once per key (store/grammars.py, migration 0017), on real SQLite and PostgreSQL:
the n choices of one request and later requests under the same grammar share one row and one byte count,
every read (a response, the learner's ratings, an episode) gets the text back, another key's same grammar
is its own row, and the row goes with the last response of its key that uses it, or with the key."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from sqlalchemy import func, select, text

from liveloop.store import FeedbackRecord, ResponseRecord, grammars
from liveloop.store.keys import utc_day
from liveloop.store.models import Grammar, Response, utcnow

GRAMMAR = '{"type": "structural_tag", "format": {"type": "const_string", "value": "' + "x" * 20_000 + '"}}'
OTHER = GRAMMAR.replace("x", "y")


def _response(rid: str, key: str = "k1", grammar: str | None = GRAMMAR, **kw) -> ResponseRecord:
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2), response_ids=(3, 4),
        behavior_logprobs=(-0.5, -0.5), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0, grammar=grammar, **kw,
    )


def _grammar_rows(store) -> list[tuple[str, int]]:
    with store.db.session() as s:
        return sorted(s.execute(select(Grammar.api_key_id, func.length(Grammar.text))).tuples())


def test_choices_and_later_requests_share_one_row_and_one_count(store):
    day = utc_day(utcnow())
    choices = [_response("r0" if i == 0 else f"r0-{i}", group_id="r0", choice_index=i) for i in range(16)]
    store.feedback.write_batch(choices)
    assert _grammar_rows(store) == [("k1", len(GRAMMAR))]
    bytes_16 = store.keys.stored_bytes("k1", day)
    assert bytes_16 < len(GRAMMAR) + 16 * 1_000, "the grammar was counted more than once"
    with store.db.session() as s:
        assert s.scalar(select(func.count()).where(Response.grammar.is_not(None))) == 0  # no copy on the rows
    store.feedback.write_batch([_response("later")])  # a later request, another batch: the same row
    assert _grammar_rows(store) == [("k1", len(GRAMMAR))]
    assert store.keys.stored_bytes("k1", day) - bytes_16 < 1_000
    store.feedback.write_batch([_response("o", key="k2"), _response("p", key="k2", grammar=OTHER), _response("free", grammar=None)])
    assert _grammar_rows(store) == [("k1", len(GRAMMAR)), ("k2", len(GRAMMAR)), ("k2", len(OTHER))]


def test_every_read_gets_the_text_back(store):
    store.feedback.write_batch([_response("a"), _response("b", grammar=OTHER), _response("c", grammar=None)])
    assert store.feedback.get_response("a").grammar == GRAMMAR
    assert store.feedback.get_response("b").grammar == OTHER
    assert store.feedback.get_response("c").grammar is None
    for rid in ("a", "b", "c"):
        store.feedback.put_feedback(FeedbackRecord(rid, "k1", 1))
    read = {r.id: r.grammar for _, r in store.feedback.rated_after(0, 10)}
    assert read == {"a": GRAMMAR, "b": OTHER, "c": None}
    (turn,) = store.episodes.episode("a").turns
    assert turn.grammar == GRAMMAR


def test_a_rows_text_from_before_the_table_still_reads(store):
    store.feedback.write_batch([_response("old", grammar=None)])
    with store.db.writing.begin() as conn:  # as migration 0016 left it: the text on the row itself
        conn.execute(Response.__table__.update().where(Response.id == "old").values(grammar=OTHER))
    assert store.feedback.get_response("old").grammar == OTHER
    assert store.episodes.episode("old").turns[0].grammar == OTHER


def test_a_row_whose_grammar_is_missing_reads_as_gone_not_as_free(store):
    """A response naming a grammar row that is not there (a database edited by hand, a partial restore) is
    not read as sampled freely: the learner would train it without its grammar's masks."""
    store.feedback.write_batch([_response("a")])
    store.feedback.put_feedback(FeedbackRecord("a", "k1", 1))
    with store.db.writing.begin() as conn:
        conn.execute(Grammar.__table__.delete())
    assert store.feedback.get_response("a") is None
    assert store.feedback.rated_after(0, 10) == []


def test_the_row_goes_with_its_last_use_or_with_the_key(store):
    store.feedback.write_batch([_response("a"), _response("b"), _response("c", grammar=OTHER), _response("d", key="k2")])
    store.rights.delete_response("a", "k1")
    assert _grammar_rows(store) == [("k1", len(GRAMMAR)), ("k1", len(OTHER)), ("k2", len(GRAMMAR))]  # b still uses it
    store.rights.delete_response("b", "k1")
    assert _grammar_rows(store) == [("k1", len(OTHER)), ("k2", len(GRAMMAR))]
    store.rights.forget_key("k1")
    assert _grammar_rows(store) == [("k2", len(GRAMMAR))]
    store.rights.delete_before(utcnow())  # retention takes k2's last response, and its grammar
    assert _grammar_rows(store) == []


def test_insert_responses_stores_them_too(store):
    store.feedback.insert_responses([_response("x"), dataclasses.replace(_response("y"), api_key_id="k3")])
    assert store.feedback.get_response("x").grammar == GRAMMAR == store.feedback.get_response("y").grammar
    assert _grammar_rows(store) == [("k1", len(GRAMMAR)), ("k3", len(GRAMMAR))]


def test_two_writers_storing_one_new_grammar_at_once_count_it_once(store, store_url):
    """PostgreSQL: the second writer's insert waits on the first's uncommitted row, then writes nothing, and
    so counts nothing (before: both counted its bytes in the key's day)."""
    if not store_url.startswith("postgresql"):
        pytest.skip("SQLite takes one writer at a time: the second reads the first's row and stores nothing")
    rec, now = _response("x"), utcnow()
    second: list = []
    with store.db.engine.connect() as a, store.db.engine.connect() as b, store.db.engine.connect() as watch:
        first_tx, second_tx = a.begin(), b.begin()
        first = grammars.store_new(a, [rec], [now])  # written, not committed
        writer = threading.Thread(target=lambda: second.append(grammars.store_new(b, [rec], [now])))
        writer.start()
        for _ in range(600):  # bounded: until the second insert waits on the first's row (a lock wait)
            waiting = watch.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )).scalar()
            if waiting:
                break
            watch.rollback()
            time.sleep(0.05)
        assert waiting, "the second writer never waited on the first"
        first_tx.commit()
        writer.join(30)
        second_tx.commit()
    assert [n for *_, n in first] == [len(GRAMMAR)]
    assert second == [[]]  # it stored nothing: nothing to count
    assert _grammar_rows(store) == [("k1", len(GRAMMAR))]
