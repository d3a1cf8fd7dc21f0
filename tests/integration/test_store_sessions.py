"""A client's session is one episode in the store (server/edge/sessions.py tags its turns), on SQLite and
PostgreSQL: its turns link even where the resent history re-tokenized differently (the engine's own
tokens stay what was sampled), token prefixes still decide where they carry, a side call is stored
apart, a retried turn is a sibling of the first try (never its continuation), and the latest turn of a
key's session is what rating the session rates."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from liveloop.store import ResponseRecord
from liveloop.store.linking import LinkKeys, session_tag

END, EOS = 9, 8
STOPS = (END, EOS)
P1 = (1, 2, 3, END, 4)
R1 = (5, 6, END)  # as sampled: the tokenizer writes this text as (56, END)
RETOKENIZED = (56, END)
OBS = (7, 4)
R2 = (11, 12, END)
NOW = datetime.now(timezone.utc)


def turn(rid: str, prompt, response, session: str | None = "s1", key: str = "k1", side: bool = False, ago: float = 0.0) -> ResponseRecord:
    prompt, response = tuple(prompt), tuple(response)
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=0, endpoint="messages", prompt_ids=prompt, response_ids=response,
        behavior_logprobs=tuple(-0.5 for _ in response), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
        created_at=NOW - timedelta(seconds=ago),
        link=None if side else LinkKeys.of(prompt, response, STOPS),  # a side call: what the server stores of one
        episode_tag=None if side or session is None else session_tag(session),
    )


def linked_by(store, rid: str) -> str | None:
    return store.episodes.view(rid).turns[-1].linked_by


def test_a_session_resent_with_other_tokens_stays_one_episode_with_the_sampled_tokens(store):
    store.feedback.write_batch([turn("t1", P1, R1, ago=3)])
    store.feedback.write_batch([turn("t2", P1 + RETOKENIZED + OBS, R2, ago=2)])  # no prefix carries: linked by the session
    t2 = store.feedback.get_response("t2")
    assert (t2.parent_id, t2.root_id, t2.turn, t2.prefix_tokens, linked_by(store, "t2")) == ("t1", "t1", 1, None, "episode_id")
    assert tuple(store.feedback.get_response("t1").response_ids) == R1  # the engine's own tokens, kept
    # the next turn carries t2 exactly: the token link decides, within the session
    store.feedback.write_batch([turn("t3", P1 + RETOKENIZED + OBS + R2 + OBS, (13, END), ago=1)])
    t3 = store.feedback.get_response("t3")
    assert (t3.parent_id, t3.root_id, t3.turn, t3.prefix_tokens) == ("t2", "t1", 2, len(P1 + RETOKENIZED + OBS + R2))
    assert [t.id for t in store.episodes.episode("t3").turns] == ["t1", "t2", "t3"]
    # without a session the same resend is a first turn (tests/integration/test_store_episodes.py)
    store.feedback.write_batch([turn("u1", P1, R1, session=None, key="k2", ago=3), turn("u2", P1 + RETOKENIZED + OBS, R2, session=None, key="k2")])
    assert store.feedback.get_response("u2").parent_id is None


def test_sessions_do_not_mix(store):
    store.feedback.write_batch([turn("a1", P1, R1, session="a", ago=2), turn("b1", P1, R1, session="b", ago=1)])
    store.feedback.write_batch([turn("a2", P1 + R1 + OBS, R2, session="a")])  # b1 carries the same tokens, and is later
    assert store.feedback.get_response("a2").parent_id == "a1"
    store.feedback.write_batch([turn("c1", P1 + R1 + OBS, R2, session="c")])
    assert store.feedback.get_response("c1").parent_id is None  # another session's turns are not its history


def test_a_side_call_is_stored_apart(store):
    store.feedback.write_batch([turn("t1", P1, R1, ago=3)])
    # a title or compaction call resending the conversation: no link either way
    store.feedback.write_batch([turn("side", P1 + R1 + OBS, (20, END), side=True, ago=2)])
    side = store.feedback.get_response("side")
    assert (side.parent_id, side.root_id, side.turn) == (None, "side", 0)
    store.feedback.write_batch([turn("t2", (30, 31), R2, ago=1)])  # a compacted history: the session links it
    assert store.feedback.get_response("t2").parent_id == "t1"  # not the side call, though it is later
    assert store.episodes.session_turn("k1", session_tag("s1")) == "t2"


def test_a_retried_first_turn_is_a_first_turn_again(store):
    store.feedback.write_batch([turn("try1", P1, R1, ago=2)])
    store.feedback.write_batch([turn("try2", P1, (5, 7, END), ago=1)])  # the client resent it (a timeout, a retry)
    try2 = store.feedback.get_response("try2")
    assert (try2.parent_id, try2.root_id, try2.turn) == (None, "try2", 0)
    # the next turn continues the try the client kept, by its tokens
    store.feedback.write_batch([turn("t2", P1 + (5, 7, END) + OBS, R2)])
    assert store.feedback.get_response("t2").parent_id == "try2"


def test_a_retried_turn_is_a_sibling_once_whichever_link_found_it(store):
    store.feedback.write_batch([turn("t1", P1, R1, ago=5)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2, ago=4)])
    store.feedback.write_batch([turn("t2b", P1 + R1 + OBS, (14, END), ago=3)])  # by prefix: t1's second continuation
    assert store.feedback.get_response("t2b").parent_id == "t1"
    store.feedback.write_batch([turn("c1", (40, 41), R2, ago=2)])  # compacted: linked by the session to t2b
    store.feedback.write_batch([turn("c1b", (40, 41), (15, END), ago=1)])  # and resent: c1's sibling, not its child
    c1, c1b = store.feedback.get_response("c1"), store.feedback.get_response("c1b")
    assert (c1.parent_id, c1.turn) == ("t2b", 2)
    assert (c1b.parent_id, c1b.root_id, c1b.turn, c1b.prefix_tokens, linked_by(store, "c1b")) == ("t2b", "t1", 2, None, "episode_id")
    assert store.episodes.view("c1b").turns[-2].other_branches == 1  # c1: one branch more at t2b, not a chain


def test_a_retry_in_the_same_batch_is_a_sibling(store):
    store.feedback.write_batch([turn("t1", P1, R1, ago=2)])
    store.feedback.write_batch([turn("c1", (40, 41), R2, ago=1), turn("c1b", (40, 41), (15, END))])
    assert store.feedback.get_response("c1").parent_id == store.feedback.get_response("c1b").parent_id == "t1"
    assert store.feedback.get_response("c1b").turn == 1


def test_the_sessions_latest_turn_is_the_keys_own(store):
    store.feedback.write_batch([turn("t1", P1, R1, ago=2), turn("t2", P1 + R1 + OBS, R2, ago=1)])
    store.feedback.write_batch([turn("other", P1, R1, key="k2")])  # another key's session of the same id
    assert store.episodes.session_turn("k1", session_tag("s1")) == "t2"
    assert store.episodes.session_turn("k2", session_tag("s1")) == "other"
    assert store.episodes.session_turn("k3", session_tag("s1")) is None
    assert store.episodes.session_turn("k1", session_tag("unknown")) is None
