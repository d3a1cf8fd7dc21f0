"""The store's per-key queries on real SQLite and PostgreSQL: quarantine with its operator event in
the same transaction, quarantined ratings kept but not trainable, key states, and the bounded ratings
the disagreement score reads, and the bytes each key stores per day."""

from __future__ import annotations

import dataclasses

from liveloop.store import FeedbackRecord, ResponseRecord, Store
from liveloop.store.keys import KeyState, content_group, utc_day
from liveloop.store.models import utcnow


def _response(rid: str, key: str, prompt=(1, 2), reply=(3, 4)) -> ResponseRecord:
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=tuple(prompt),
        response_ids=tuple(reply), behavior_logprobs=tuple(-0.5 for _ in reply), finish_reason="stop",
        temperature=1.0, top_p=1.0, latency_ms=1.0,
    )


def _rate(store: Store, rid: str, key: str, reward: int, **kw) -> None:
    store.feedback.write_batch([_response(rid, key, **kw)])
    store.feedback.put_feedback(FeedbackRecord(rid, key, reward))


def test_quarantine_changes_once_and_logs_an_event(store):
    assert store.keys.quarantined_keys() == set()
    assert not store.keys.set_quarantined("k1", False, "nothing to release")  # no row, not quarantined: no change
    assert store.keys.set_quarantined("k1", True, "z=7.1", api_key_id="admin")
    assert not store.keys.set_quarantined("k1", True, "again")  # already: no change, no event
    assert store.keys.quarantined_keys() == {"k1"}
    assert store.keys.set_quarantined("k1", False, "false alarm")
    assert store.keys.quarantined_keys() == set()
    events = [(e.kind, e.detail, e.api_key_id) for e in store.operator.events()]
    assert events == [
        ("quarantine", {"key_id": "k1", "reason": "z=7.1"}, "admin"),
        ("unquarantine", {"key_id": "k1", "reason": "false alarm"}, None),
    ]


def test_quarantined_ratings_are_kept_but_not_trainable(store):
    _rate(store, "a", "honest", 1)
    _rate(store, "b", "bad", 0)
    _rate(store, "c", "honest", 1)
    assert store.keys.set_quarantined("bad", True, "inverts")
    assert [f.response_id for f, _ in store.feedback.rated_after(0, 10)] == ["a", "c"]
    assert [f.reward for f in store.feedback.get_feedback("b")] == [0]  # still stored
    assert [(r.key_id, r.reward) for r in store.keys.key_ratings()] == [("honest", 1), ("bad", 0), ("honest", 1)]
    store.keys.set_quarantined("bad", False)
    assert [f.response_id for f, _ in store.feedback.rated_after(0, 10)] == ["a", "b", "c"]


def test_key_states_list_rated_and_decided_keys(store):
    _rate(store, "a", "k1", 1)
    _rate(store, "b", "k1", 0)
    store.keys.set_quarantined("k2", True, "by hand")  # never rated anything
    states = store.keys.key_states()
    assert [(s.key_id, s.quarantined, s.reason, s.ratings) for s in states] == [("k1", False, None, 2), ("k2", True, "by hand", 0)]
    assert isinstance(states[1], KeyState) and states[1].updated_at is not None and states[0].updated_at is None


def test_key_ratings_group_by_exact_prompt_and_reply_and_are_bounded(store):
    _rate(store, "a", "k1", 1, prompt=(1, 2), reply=(3,))
    _rate(store, "b", "k2", 0, prompt=(1, 2), reply=(3,))  # same prompt, same reply: same group
    _rate(store, "c", "k3", 1, prompt=(1, 2), reply=(4,))  # another reply
    _rate(store, "d", "k1", 1, prompt=(1,), reply=(2, 3))  # same tokens, split differently: another group
    rows = store.keys.key_ratings()
    assert [r.key_id for r in rows] == ["k1", "k2", "k3", "k1"]
    assert rows[0].group == rows[1].group != rows[2].group
    assert rows[3].group not in (rows[0].group, rows[2].group)
    from liveloop.store import codec

    assert rows[2].group == content_group(codec.encode_ids([1, 2]), codec.encode_ids([4]))
    newest = store.keys.key_ratings(limit=2)  # the newest 2, oldest first
    assert [r.feedback_id for r in newest] == [rows[2].feedback_id, rows[3].feedback_id]


def test_each_keys_stored_bytes_are_counted_per_day_with_its_rows(store):
    """The writer adds a key's rows to its day's count in the inserting transaction: n choices are n rows,
    a batch of several keys counts each apart, a row dropped by a deletion counts nothing, and
    forgetting the key removes its counts."""
    day = utc_day(utcnow())
    assert store.keys.stored_bytes("k1", day) == 0
    long = _response("a", "k1", prompt=tuple(range(4000)))
    store.feedback.write_batch([long])
    one = store.keys.stored_bytes("k1", day)
    assert one >= 4000 * 2  # the prompt's 4,000 ids, however the codec packs them (at least 2 bytes each here)
    choices = [dataclasses.replace(long, id=f"a-{i}", group_id="a", choice_index=i) for i in range(1, 4)]
    store.feedback.write_batch([*choices, _response("b", "k2")])
    assert store.keys.stored_bytes("k1", day) >= 4 * one - 64  # each choice its own row (group fields aside)
    assert 0 < store.keys.stored_bytes("k2", day) < one
    assert store.keys.stored_bytes("k1", day - 1) == 0  # yesterday's count is another row
    store.rights.delete_response("gone", "k2")  # a tombstone first: the writer drops the row
    before = store.keys.stored_bytes("k2", day)
    store.feedback.write_batch([_response("gone", "k2")])
    assert store.keys.stored_bytes("k2", day) == before
    store.rights.forget_key("k1")
    assert store.keys.stored_bytes("k1", day) == 0 and store.keys.stored_bytes("k2", day) == before
