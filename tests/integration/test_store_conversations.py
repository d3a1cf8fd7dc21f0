"""The conversations a chat-shaped response keeps (migration 0012), on SQLite and PostgreSQL: what the
API reads back for the key that got the response and for nobody else, a Responses chain walked turn
by turn, a key's stored completions a page at a time with model and metadata filters, and deletion,
forgetting and the writer's tombstones covering them like the rest of the row."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from liveloop.store import MAX_CHAIN, ChainTooLong, ResponseRecord

CALL = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"a": 1}'}}
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


def _record(rid: str, key: str = "k1", endpoint: str = "chat", previous: str | None = None, meta=None, at: datetime | None = None,
            model: str = "m", grammar: str | None = None, messages=None) -> ResponseRecord:
    return ResponseRecord(
        id=rid, api_key_id=key, model=model, policy_version=0, endpoint=endpoint, prompt_ids=(1, 2), response_ids=(3, 4),
        behavior_logprobs=(-0.5, 0.0), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0, request_meta=meta,
        created_at=at, messages=messages if messages is not None else [{"role": "user", "content": f"ask {rid}"}], tools=TOOLS,
        output={"role": "assistant", "content": None, "tool_calls": [CALL]}, options={"instructions": "be brief"},
        grammar=grammar, previous_response_id=previous,
    )


def test_a_conversation_reads_back_for_its_key_only(store):
    store.feedback.write_batch([_record("r1", grammar='{"type": "structural_tag"}', meta={"topic": "cats"})])
    got = store.conversations.get("r1", "k1", ("chat",))
    assert got.messages == [{"role": "user", "content": "ask r1"}] and got.tools == TOOLS
    assert got.output["tool_calls"] == [CALL] and got.options == {"instructions": "be brief"}
    assert (got.prompt_tokens, got.completion_tokens, got.request_meta) == (2, 2, {"topic": "cats"})
    assert store.conversations.get("r1", "k2", ("chat",)) is None  # another key: nothing, as if there were none
    assert store.conversations.get("r1", "k1", ("responses",)) is None  # another endpoint's ids are not these
    assert store.feedback.get_response("r1").grammar == '{"type": "structural_tag"}'  # the learner reads the grammar


def test_a_responses_chain_is_walked_oldest_first_and_breaks_where_a_turn_is_gone(store):
    store.feedback.write_batch([_record("a", endpoint="responses"), _record("b", endpoint="responses", previous="a"),
                       _record("c", endpoint="responses", previous="b"), _record("x", key="k2", endpoint="responses", previous="b")])
    assert [t.id for t in store.conversations.chain("c", "k1", ("responses",))] == ["a", "b", "c"]
    assert store.conversations.chain("x", "k2", ("responses",)) is None  # k2 cannot continue k1's turns
    assert store.conversations.chain("c", "k2", ("responses",)) is None
    store.rights.delete_response("b", "k1")
    assert store.conversations.chain("c", "k1", ("responses",)) is None


def test_a_looping_or_endless_chain_is_refused(store):
    store.feedback.write_batch([_record("p", endpoint="responses", previous="q"), _record("q", endpoint="responses", previous="p")])
    with pytest.raises(ChainTooLong):
        store.conversations.chain("p", "k1", ("responses",))
    assert MAX_CHAIN >= 300  # an agent of 300 turns fits


def test_stored_completions_page_by_time_with_filters(store):
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    store.feedback.write_batch([
        _record(f"c{i}", at=t0 + timedelta(seconds=i), meta={"topic": "cats" if i % 2 else "dogs"}, model="m" if i < 4 else "m2")
        for i in range(6)
    ] + [_record("k2-only", key="k2", at=t0)])
    page = store.conversations.page("k1", ("chat",), 3)
    assert [c.id for c in page] == ["c0", "c1", "c2"]
    assert [c.id for c in store.conversations.page("k1", ("chat",), 3, after="c2")] == ["c3", "c4", "c5"]
    assert [c.id for c in store.conversations.page("k1", ("chat",), 2, descending=True)] == ["c5", "c4"]
    assert [c.id for c in store.conversations.page("k1", ("chat",), 9, metadata={"topic": "cats"})] == ["c1", "c3", "c5"]
    assert [c.id for c in store.conversations.page("k1", ("chat",), 9, model="m2", metadata={"topic": "dogs"})] == ["c4"]
    assert store.conversations.page("k1", ("chat",), 9, after="k2-only") is None  # another key's id is no cursor
    # a key of any text filters exactly (SQLite's JSON paths cannot name some: json_each does)
    odd = {"a.b": "1", 'q"k': "2", "x\\y": "3", "$[0]": "4"}
    store.feedback.write_batch([_record("odd", meta=odd, at=t0)])
    for key, value in odd.items():
        assert [c.id for c in store.conversations.page("k1", ("chat",), 9, metadata={key: value})] == ["odd"]
        assert store.conversations.page("k1", ("chat",), 9, metadata={key: value + "!"}) == []
    assert [c.id for c in store.conversations.page("k2", ("chat",), 9)] == ["k2-only"]


def test_forget_and_tombstones_cover_the_conversation(store):
    store.feedback.write_batch([_record("f1", key="gone"), _record("f2", key="kept")])
    store.rights.forget_key("gone")
    assert store.conversations.get("f1", "gone", ("chat",)) is None
    store.rights.delete_response("later", "kept")  # deleted before it is logged: the writer drops it
    store.feedback.write_batch([_record("later", key="kept")])
    assert store.conversations.get("later", "kept", ("chat",)) is None and store.feedback.get_response("later") is None
    assert store.conversations.get("f2", "kept", ("chat",)) is not None
