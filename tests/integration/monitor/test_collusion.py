"""Colluding keys against the server's automatic quarantine, over a real store (`Operations`): keys
that rate an honest key's replies inverted cannot get it quarantined (two against a rule of 3
corroborating keys; 3, 5 and 10 against the shipped 11) and are quarantined themselves when enough
independent keys side against them; their votes on many near-copies of a reply count once; and
near-identical replies to the same prompt (one token apart) share one consensus."""

import pytest

from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.server.control.operations import Operations
from liveloop.server.control.activator import Activator
from liveloop.store import FeedbackRecord, ResponseRecord, Store

HONEST = [f"honest{i:010d}" for i in range(5)]
TARGET = "target0000000000"  # an honest key the colluders aim at
COLLUDERS = ["colluder00000000", "colluder00000001"]
REPLY = tuple(range(100, 112))  # 12 tokens: one token apart is a Jaccard of 11/13


def _ops(store: Store, **monitor) -> Operations:
    """Five honest keys: the rule of 3 corroborating keys (2 colluders withstood) unless told otherwise."""
    config = MonitorConfig(**{"quarantine_z": 4.0, "quarantine_min_ratings": 30, "quarantine_corroborating_keys": 3, **monitor})
    activator = Activator(None, store.versions, store.operator, Metrics())
    return Operations(
        config, activator, Metrics(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
    )


def _write(store: Store, rows: list[tuple[str, str, tuple[int, ...], tuple[int, ...], int]]) -> None:
    """(response id, key, prompt, reply, reward) -> stored responses and ratings."""
    store.feedback.write_batch([ResponseRecord(rid, key, "m", 0, "chat", prompt, reply, (-1.0,) * len(reply), "stop", 1.0, 1.0, 1.0)
                       for rid, key, prompt, reply, _ in rows])
    store.feedback.write_batch([FeedbackRecord(rid, key, reward) for rid, key, _, _, reward in rows])


def _framing(store: Store, framed: int, shared: int, colluders: list[str] = COLLUDERS, honest: list[str] = HONEST) -> None:
    """`framed` prompts whose reply only the target and the colluders rated (the colluders inverted);
    `shared` prompts whose reply the honest keys, the target and the colluders rated (colluders inverted)."""
    rows = []
    for p in range(framed):
        good = p % 2
        rows += [(f"f{p}-{k}", k, (1, p), REPLY, good if k == TARGET else 1 - good) for k in [TARGET] + colluders]
    for p in range(shared):
        good = p % 2
        rows += [(f"s{p}-{k}", k, (2, p), REPLY, 1 - good if k in colluders else good) for k in honest + [TARGET] + colluders]
    _write(store, rows)


def test_two_colluders_cannot_get_an_honest_key_quarantined_and_are_taken(store):
    # the target: 90 framed disagreements of 120 ratings, q = 1/2 -> z = (90 - 60) / sqrt(30) = 5.5 over 4.0;
    # each colluder: 30 of 30 on the shared prompts -> z = 5.5 too
    _framing(store, framed=90, shared=30)
    ops = _ops(store)
    z = {k: d.z for k, d in ops._scores()[1].items()}
    assert z[TARGET] > 5 and all(z[k] > 5 for k in COLLUDERS)  # uncorroborated, all three are over the threshold
    assert sorted(ops.quarantine_suspects()) == COLLUDERS
    states = {k.key_id: k for k in store.keys.key_states()}
    assert not states[TARGET].quarantined and not any(states[k].quarantined for k in HONEST)
    assert "without its 2 top accusers" in states[COLLUDERS[0]].reason
    assert ops.quarantine_suspects() == []  # the colluders no longer vote: the target's framed replies have no consensus


def test_without_corroboration_the_colluders_win(store):
    # the same traffic with one key enough (the rule before corroboration): the target is taken too
    _framing(store, framed=90, shared=30)
    assert TARGET in _ops(store, quarantine_corroborating_keys=1).quarantine_suspects()


def test_colluders_votes_on_near_copies_count_once(store):
    # per prompt: the honest keys rate the reply; the colluders rate it and four near-copies (one token
    # apart) inverted, twice each; the target rated a near-copy nobody honest was served
    rows = []
    for p in range(40):
        good = p % 2
        rows += [(f"p{p}-{k}", k, (3, p), REPLY, good) for k in HONEST[:3]]
        for k in COLLUDERS:
            for v in range(5):
                variant = REPLY[:-1] + (900 + v,) if v else REPLY
                rows += [(f"p{p}-{k}-{v}-{c}", k, (3, p), variant, 1 - good) for c in range(2)]
        rows.append((f"p{p}-{TARGET}", TARGET, (3, p), REPLY[:-1] + (901,), good))
    _write(store, rows)
    ops = _ops(store)
    scores = {d.key_id: d for d in ops._scores()[1].values()}
    # the target's consensus: 3 honest votes up, 2 colluder votes down (one each, over 10 ratings) -> it agrees
    assert scores[TARGET].n == 40 and scores[TARGET].disagreements == 0
    assert ops.quarantine_suspects() == COLLUDERS  # 400 ratings each, against 3 honest keys and the target
    assert not store.keys.key_states()[-1].quarantined and store.keys.key_states()[-1].key_id == TARGET


def test_near_identical_replies_share_the_consensus(store):
    # an inverting key is served its own near-copy of each reply (one token apart): only a consensus over
    # similar replies sees it
    rows = []
    for p in range(40):
        good = p % 2
        rows += [(f"n{p}-{k}", k, (4, p), REPLY, good) for k in HONEST]
        rows.append((f"n{p}-bad", "inverter00000000", (4, p), (777,) + REPLY[1:], 1 - good))
    _write(store, rows)
    assert _ops(store).quarantine_suspects() == ["inverter00000000"]
    # exact copies only: its replies have no consensus at all
    assert _ops(store, similar_reply_jaccard=1.0).quarantine_suspects() == []


@pytest.mark.parametrize("n", [3, 5, 10])
def test_up_to_ten_colluders_cannot_frame_an_honest_key_under_the_shipped_rule(store, n):
    """The shipped rule (11 corroborating keys: its 10 top accusers left out). 3, 5 or 10 colluders frame
    the target on 90 prompts nobody else asked; on 30 shared prompts 24 honest keys side against them.
    The rule of 3 takes the target once there are 3 colluders; the shipped one never does. (Three or more
    colluders also agree with each other on the framed prompts, which hides them: their own scores stay
    below chance, under either rule.)"""
    colluders = [f"colluder{i:08d}" for i in range(n)]
    honest = [f"honest{i:010d}" for i in range(24)]
    _framing(store, framed=90, shared=30, colluders=colluders, honest=honest)
    assert TARGET in {s.score.key_id for s in _ops(store)._scores()[2]}  # the old rule of 3 frames it
    activator = Activator(None, store.versions, store.operator, Metrics())
    shipped = Operations(
        MonitorConfig(quarantine_z=4.0, quarantine_min_ratings=30), activator, Metrics(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
    )
    assert shipped.config.quarantine_corroborating_keys == 11
    assert TARGET in {d.key_id for d in shipped._scores()[1].values() if d.z > 4.0}  # over the threshold, uncorroborated
    assert shipped.quarantine_suspects() == []
    states = {k.key_id: k for k in store.keys.key_states()}
    assert not states[TARGET].quarantined and not any(states[k].quarantined for k in honest)
