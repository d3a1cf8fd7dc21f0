"""Episodes in the store (migration 0013), on SQLite and PostgreSQL: a turn links to the one it continues
by the resent conversation's tokens, by `previous_response_id` or by `metadata.episode_id`; never to
another key's; two continuations of one turn are two episodes sharing it; an episode reads back first
turn first with the observation tokens between turns; deleting a turn takes the turns after it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from liveloop.store import ResponseRecord
from liveloop.store.linking import LinkKeys, episode_tag

END, EOS = 9, 8  # the template's end-of-turn marker, the model's other stop token
STOPS = (END, EOS)


def turn(rid: str, prompt, response, key: str = "k1", previous: str | None = None, meta=None, at=None, output=None) -> ResponseRecord:
    prompt, response = tuple(prompt), tuple(response)
    return ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=prompt, response_ids=response,
        behavior_logprobs=tuple(-0.5 for _ in response), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
        request_meta=meta, created_at=at, previous_response_id=previous, link=LinkKeys.of(prompt, response, STOPS),
        episode_tag=episode_tag(meta), output=output,
    )


P1 = (1, 2, 3, END, 4)  # system + user, then the assistant header
R1 = (5, 6, END)  # a tool call, closed by the end marker the template writes too
OBS = (7, 4)  # the tool's result turn and the next assistant header
R2 = (11, 12, END)


def test_a_resent_conversation_links_to_the_turn_it_carries(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    store.feedback.write_batch([turn("t3", P1 + R1 + OBS + R2 + OBS, (13, END))])
    t2, t3 = store.feedback.get_response("t2"), store.feedback.get_response("t3")
    assert (t2.parent_id, t2.root_id, t2.turn, t2.prefix_tokens) == ("t1", "t1", 1, len(P1 + R1))
    assert (t3.parent_id, t3.root_id, t3.turn) == ("t2", "t1", 2)
    episode = store.episodes.episode("t3")
    assert episode.complete and [t.id for t in episode.turns] == ["t1", "t2", "t3"]
    assert tuple(episode.prompt_ids) == P1 + R1 + OBS + R2 + OBS
    assert store.feedback.get_response("t1").parent_id is None and store.feedback.get_response("t1").root_id == "t1"


def test_a_stop_token_the_template_rewrites_is_an_observation(store):
    store.feedback.write_batch([turn("t1", P1, (5, 6, EOS))])  # the model stopped on eos; the template closes with END
    store.feedback.write_batch([turn("t2", P1 + (5, 6, END) + OBS, R2)])
    assert store.feedback.get_response("t2").prefix_tokens == len(P1) + 2  # eos is not in the context: not an action there


def test_a_prompt_that_does_not_carry_the_tokens_is_a_first_turn(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + (5, 60, END) + OBS, R2)])  # the reply re-tokenized differently
    assert store.feedback.get_response("t2").parent_id is None


def test_a_batch_of_long_agent_prompts_is_written_however_many_prefix_hashes_it_carries(store):
    # 64 prompts of MAX_CANDIDATES turn boundaries each, distinct: 262,144 prefix hashes in one writer
    # batch, past SQLite's variable limit in every build (32,766; 250,000 in Debian's)
    from liveloop.store.linking import MAX_CANDIDATES

    boundaries = tuple(x for i in range(MAX_CANDIDATES) for x in (100 + i % 50, END))
    store.feedback.write_batch([turn("t1", P1, R1)])
    batch = [turn(f"b{i}", (1000 + i,) + boundaries, R2) for i in range(63)] + [turn("t2", P1 + R1 + OBS, R2)]
    assert sum(len(r.link.candidates) for r in batch) > 250_000
    with store.db.writing.begin() as conn:  # one transaction (write_batch would retry each record alone)
        store.feedback.apply_batch(conn, batch, None)
    assert store.feedback.get_response("t2").parent_id == "t1"  # still linked, through a later chunk or not
    assert all(store.feedback.get_response(f"b{i}").parent_id is None for i in (0, 62))


def test_another_keys_conversation_never_links(store):
    store.feedback.write_batch([turn("t1", P1, R1, key="k1")])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2, key="k2")])
    assert store.feedback.get_response("t2").parent_id is None


def test_previous_response_id_links_and_says_whether_the_tokens_carry(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2, previous="t1"), turn("t3", (1, 2), R2, previous="t1")])
    t2, t3 = store.feedback.get_response("t2"), store.feedback.get_response("t3")
    assert (t2.parent_id, t2.prefix_tokens) == ("t1", len(P1 + R1))
    assert (t3.parent_id, t3.prefix_tokens, t3.turn) == ("t1", None, 1)  # linked, not a token extension


def test_an_episode_id_links_the_latest_turn_with_it(store):
    now = datetime.now(timezone.utc)
    store.feedback.write_batch([turn("a1", P1, R1, meta={"episode_id": "job-1"}, at=now - timedelta(seconds=2)),
                       turn("b1", P1, R1, meta={"episode_id": "job-2"}, at=now - timedelta(seconds=1))])
    store.feedback.write_batch([turn("a2", (40, 41), R2, meta={"episode_id": "job-1"})])  # a compacted history: no prefix
    a2 = store.feedback.get_response("a2")
    assert (a2.parent_id, a2.prefix_tokens) == ("a1", None)
    # with a tag, the prefix match is looked for only among the tag's turns: b1 carries the same tokens
    store.feedback.write_batch([turn("b2", P1 + R1 + OBS, R2, meta={"episode_id": "job-2"})])
    assert (store.feedback.get_response("b2").parent_id, store.feedback.get_response("b2").prefix_tokens) == ("b1", len(P1 + R1))


def test_two_continuations_are_two_episodes_sharing_a_prefix(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("x", P1 + R1 + OBS, R2), turn("y", P1 + R1 + (7, 7, 4), (14, END))])
    assert store.feedback.get_response("x").parent_id == store.feedback.get_response("y").parent_id == "t1"
    view = store.episodes.view("y")
    assert [t.id for t in view.turns] == ["t1", "y"] and view.turns[0].other_branches == 1
    assert view.turns[1].observation_tokens == 3
    assert sorted(store.episodes.latest(10)) == ["x", "y"]


def test_a_parent_in_the_same_batch_links(store):
    store.feedback.write_batch([turn("t1", P1, R1), turn("t2", P1 + R1 + OBS, R2), turn("t3", P1 + R1 + OBS + R2 + OBS, (13, END))])
    assert [store.feedback.get_response(i).turn for i in ("t1", "t2", "t3")] == [0, 1, 2]
    assert store.feedback.get_response("t3").root_id == "t1"


def test_the_latest_of_equal_turns_is_the_parent(store):
    now = datetime.now(timezone.utc)
    store.feedback.write_batch([turn("old", P1, R1, at=now - timedelta(seconds=5)), turn("new", P1, R1, at=now - timedelta(seconds=1))])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    assert store.feedback.get_response("t2").parent_id == "new"


def test_the_longest_carried_turn_is_the_parent(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    store.feedback.write_batch([turn("t3", P1 + R1 + OBS + R2 + OBS, (13, END))])  # carries t1 and t2: t2 is the parent
    assert store.feedback.get_response("t3").parent_id == "t2"


def test_deleting_a_turn_takes_the_turns_after_it_and_breaks_nothing_before(store):
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    store.feedback.write_batch([turn("t3", P1 + R1 + OBS + R2 + OBS, (13, END))])
    deleted = store.rights.delete_response("t2", "k1")
    assert deleted.responses == 2 and store.feedback.get_response("t3") is None and store.feedback.get_response("t1") is not None
    assert store.episodes.episode("t1").complete


def test_retention_takes_an_old_turn_with_the_turns_after_it(store):
    now = datetime.now(timezone.utc)
    store.feedback.write_batch([turn("t1", P1, R1, at=now - timedelta(days=10))])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    assert store.rights.delete_before(now - timedelta(days=1)).responses == 2
    assert store.feedback.get_response("t2") is None


def test_an_episode_whose_first_turn_is_gone_reads_as_broken(store):
    from sqlalchemy import delete
    from liveloop.store.models import Response
    store.feedback.write_batch([turn("t1", P1, R1)])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    with store.engine.begin() as conn:  # a row gone under it (a restore of part of the database, say)
        conn.execute(delete(Response).where(Response.id == "t1"))
    episode = store.episodes.episode("t2")
    assert not episode.complete and [t.id for t in episode.turns] == ["t2"]


def test_the_link_lookup_is_an_index_search(store):
    if store.dialect != "sqlite":
        pytest.skip("the query plan is read on SQLite; PostgreSQL's depends on its statistics")
    with store.engine.connect() as conn:
        plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT id FROM responses WHERE api_key_id IN ('k1') AND link_hash IN (1, 2, 3)"))
    assert "ix_responses_key_link_hash" in plan, plan


def test_version_traffic_counts_episodes_not_turns(store):
    from liveloop.store import FeedbackRecord

    store.feedback.write_batch([turn("t1", P1, R1), turn("solo", (1, 2), (3, END))])
    store.feedback.write_batch([turn("t2", P1 + R1 + OBS, R2)])
    store.feedback.write_batch([FeedbackRecord("t1", "k1", 0), FeedbackRecord("t2", "k1", 1), FeedbackRecord("solo", "k1", 0)])
    traffic = store.release.version_traffic()[0]
    assert (traffic.responses, traffic.ratings, traffic.positive) == (2, 2, 1)  # the two-turn episode and the lone reply
