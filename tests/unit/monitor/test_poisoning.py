"""The disagreement score (monitor/poisoning.py) on hand-computed cases: an inverting key, a key with
the others' taste, a key with an unrelated taste, one vote per key in the consensus, quarantined keys
left out of it, and the quarantine rule."""

from __future__ import annotations

import math

import pytest

from liveloop.monitor.poisoning import Disagreement, consensus_labels, disagreement_scores, score, suspects
from liveloop.store.keys import KeyRating


def _ratings(table: dict[str, dict[str, list[int]]]) -> list[KeyRating]:
    """{group: {key: [rewards]}} -> ratings, in a fixed order."""
    out = []
    for g, per_key in table.items():
        for key, rewards in per_key.items():
            for r in rewards:
                out.append(KeyRating(len(out) + 1, key, g, r))
    return out


# A, B and D share a taste; C inverts it; E's taste is unrelated to theirs.
TABLE = {
    "g1": {"A": [1], "B": [1], "C": [0], "D": [1]},
    "g2": {"A": [0], "B": [0], "C": [1], "D": [0]},
    "g3": {"A": [1], "B": [1], "C": [0], "D": [1]},
    "g4": {"A": [0], "B": [0], "C": [1], "D": [0]},
}


def _by_key(scores: list[Disagreement]) -> dict[str, Disagreement]:
    return {s.key_id: s for s in scores}


def test_an_inverting_key_scores_high_and_an_agreeing_key_low():
    s = _by_key(disagreement_scores(_ratings(TABLE)))
    # C: the others (A, B, D) say 1, 0, 1, 0; C says 0, 1, 0, 1 -> 4 disagreements.
    # q = 0.5 -> expected = 4 * 0.5 = 2, variance = 4 * 0.25 = 1 -> z = (4 - 2) / 1 = 2
    assert s["C"] == Disagreement("C", 4, 4, 2.0, 2.0, 0.5)
    # A: others B, C, D -> consensus 2/3 on g1, g3 (label 1) and 1/3 on g2, g4 (label 0): A agrees always
    assert s["A"] == Disagreement("A", 4, 0, 2.0, -2.0, 0.5)


def test_a_key_with_an_unrelated_taste_has_z_near_zero():
    table = {g: dict(v) for g, v in TABLE.items()}
    for g, r in zip(("g1", "g2", "g3", "g4"), (1, 1, 0, 0)):
        table[g]["E"] = [r]
    s = _by_key(disagreement_scores(_ratings(table)))
    # E vs labels 1, 0, 1, 0 (A, B, D outvote C): disagrees on g2 and g3 -> 2 = expected (q = 0.5)
    assert (s["E"].disagreements, s["E"].expected, s["E"].z) == (2, 2.0, 0.0)


def test_a_harsher_key_with_the_same_taste_is_not_suspicious():
    # labels 1, 0, 1, 0, 1, 0 from A and B; H says up only on 1 of the 3 good ones (q = 1/6)
    table = {f"g{i}": {"A": [i % 2], "B": [i % 2]} for i in range(1, 7)}
    for i, r in enumerate([1, 0, 0, 0, 0, 0], start=1):
        table[f"g{i}"]["H"] = [r]
    h = _by_key(disagreement_scores(_ratings(table)))["H"]
    # disagreements: g3, g5 (said 0 where consensus is 1) = 2
    # expected = 3 * (1 - 1/6) + 3 * (1/6) = 3; variance = 6 * 1/6 * 5/6 = 5/6
    assert h.disagreements == 2 and h.expected == pytest.approx(3.0)
    assert h.z == pytest.approx((2 - 3) / math.sqrt(5 / 6)) and h.z < 0


def test_one_vote_per_key_and_ties_are_no_consensus():
    # X rates the same reply down five times; A and B up once each.
    ratings = _ratings({"g": {"A": [1], "B": [1], "X": [0, 0, 0, 0, 0]}})
    labelled = consensus_labels(ratings)
    # X: others A, B -> 1 (all 5 ratings counted); A: others B (1) and X (0) -> mean 0.5 = tie -> left out
    assert [(r.key_id, c) for r, c in labelled] == [("X", 1)] * 5
    x = _by_key(disagreement_scores(ratings))["X"]
    assert (x.n, x.disagreements, x.z) == (5, 5, 0.0)  # q = 0: a constant rater has no chance variance


def test_quarantined_keys_are_left_out_of_the_consensus_but_still_scored():
    # A, B, C share a taste; Q, S (quarantined) and R invert it, on the same two replies
    ratings = _ratings({
        "g1": {"A": [1], "B": [1], "C": [1], "Q": [0], "S": [0], "R": [0]},
        "g2": {"A": [0], "B": [0], "C": [0], "Q": [1], "S": [1], "R": [1]},
    })
    # counted in: A's others are B, C (1) and Q, S, R (0) -> 0.4 on g1 -> label 0: A looks like the inverter
    assert _by_key(disagreement_scores(ratings))["A"].disagreements == 2
    s = _by_key(disagreement_scores(ratings, exclude_from_consensus={"Q", "S"}))
    # left out: A's others are B, C, R -> 2/3 -> label 1 on g1, 1/3 -> 0 on g2: A agrees
    assert s["A"].disagreements == 0 and s["A"].z == pytest.approx(-math.sqrt(2))
    assert s["R"].disagreements == 2 and s["R"].z == pytest.approx(math.sqrt(2))
    # Q is still scored, against A, B, C and R (S left out): 3/4 -> label 1 on g1; 2 disagreements,
    # q = 0.5 -> expected 1, variance 0.5
    assert s["Q"] == Disagreement("Q", 2, 2, 1.0, pytest.approx(math.sqrt(2)), 0.5)


def test_unshared_replies_carry_no_consensus():
    assert disagreement_scores(_ratings({"g1": {"A": [1]}, "g2": {"B": [0]}})) == []
    assert score("K", []) == Disagreement("K", 0, 0, 0.0, 0.0, 0.0)


def test_suspects_need_enough_ratings_and_a_positive_z_over_the_threshold():
    scores = [
        Disagreement("few", 10, 10, 5.0, 9.0, 0.5),
        Disagreement("bad", 40, 35, 20.0, 4.7, 0.5),
        Disagreement("agrees", 40, 0, 20.0, -6.3, 0.5),
        Disagreement("meh", 40, 22, 20.0, 0.6, 0.5),
    ]
    assert [s.key_id for s in suspects(scores, 3.0, 30)] == ["bad"]
    assert suspects(scores, 0.0, 1) == []  # 0 = auto-quarantine off
