"""The parts of the disagreement score that colluding keys aim at, on hand-computed cases: which replies
are the same thing (`shingles`, `jaccard`, `reply_groups`), one vote per key in a group of similar
replies, and the corroboration rule (`top_accusers`, `find_suspects`): two colluders cannot get an
honest key quarantined, and are themselves taken when enough independent keys side against them."""

from __future__ import annotations

import math

import pytest

from liveloop.monitor.poisoning import EXACT, ReplyGroups, Similarity, consensus_labels, disagreement_scores, find_suspects, jaccard, reply_groups, shingles, top_accusers
from liveloop.store.keys import KeyRating

REPLY = tuple(range(100, 112))  # 12 distinct tokens
NEAR = REPLY[:-1] + (999,)  # one token different: Jaccard 11 / 13


def _r(key: str, reward: int, prompt: str = "", tokens: tuple[int, ...] = (), group: str | None = None) -> KeyRating:
    return KeyRating(0, key, group or f"{prompt}:{tokens}", reward, prompt, tokens)


def test_shingles_and_jaccard():
    assert shingles((1, 2, 3, 2)) == {(1,), (2,), (3,)}
    assert shingles((1, 2, 3), 2) == {(1, 2), (2, 3)}
    assert shingles((1,), 2) == {(1,)} and shingles((), 1) == {()}
    assert jaccard(shingles(REPLY), shingles(NEAR)) == pytest.approx(11 / 13)
    assert jaccard(frozenset(), frozenset()) == 1.0 and jaccard(frozenset({1}), frozenset({2})) == 0.0


def test_near_identical_replies_to_the_same_prompt_share_a_group():
    ratings = [
        _r("a", 1, "p", REPLY),
        _r("b", 1, "p", NEAR),  # 11/13 = 0.85 >= 0.8: a's group
        _r("c", 1, "p", REPLY[:6] + tuple(range(500, 506))),  # 6/18: a new group
        _r("d", 1, "q", REPLY),  # another prompt: never the same thing
        _r("e", 1, "p", REPLY),  # an exact copy: a's group
        _r("f", 1, group="legacy"),  # no tokens: its exact group
    ]
    g = reply_groups(ratings)
    assert g[0] == g[1] == g[4] and len({g[0], g[2], g[3], g[5]}) == 4 and g[5] == "legacy"
    exact = reply_groups(ratings, EXACT)
    assert exact[0] == exact[4] != exact[1]
    assert reply_groups(ratings, Similarity(jaccard=0.9))[1] != g[0]  # 0.85 < 0.9


def test_a_reply_joins_the_most_similar_group_in_arrival_order():
    far = REPLY[:-3] + (900, 901, 902)  # 9/15 = 0.6 from REPLY
    between = REPLY[:-2] + (901, 902)  # 10/14 from REPLY, 11/13 from far
    g = reply_groups([_r("a", 1, "p", REPLY), _r("b", 1, "p", far), _r("c", 1, "p", between)], Similarity(jaccard=0.7))
    assert g[0] != g[1] and g[2] == g[1]  # both pass 0.7; far is the closer representative


def test_one_vote_per_key_over_similar_copies():
    # a, b, c rate the reply up once; colluders x, y rate it and four near-copies down twice each (10 ratings
    # each). h rated a near-copy that only x and y rated too.
    ratings = [_r(k, 1, "p", REPLY) for k in "abc"]
    for k in "xy":
        for v in range(5):
            variant = REPLY[:-1] + (900 + v,) if v else REPLY
            ratings += [_r(k, 0, "p", variant)] * 2
    ratings.append(_r("h", 1, "p", REPLY[:-1] + (901,)))
    labels = {r.key_id: c for r, c in consensus_labels(ratings)}
    # h's consensus: a, b, c (1) and x, y (0), one vote each -> 3/5 -> 1 (counted per rating it would be 3/23)
    assert labels["h"] == 1 and labels["x"] == 1
    assert consensus_labels(ratings, similarity=EXACT)[-1][1] == 0  # exact copies only: x and y alone rated h's reply


def test_top_accusers_by_count_then_key_id():
    from collections import Counter

    assert top_accusers(Counter({"b": 3, "a": 3, "c": 5, "d": 1}), 2) == ["c", "a"]
    assert top_accusers(Counter({"a": 1}), 0) == [] and top_accusers(Counter(), 2) == []


def _framing(framed: int, shared: int) -> list[KeyRating]:
    """`framed` groups that only the honest key h and colluders x, y rated (x, y invert h); `shared`
    groups that honest keys a..e, h, x and y rated (x, y invert them). Rewards alternate 1, 0."""
    out = []
    for g in range(framed):
        good = g % 2
        out += [_r("h", good, group=f"f{g}"), _r("x", 1 - good, group=f"f{g}"), _r("y", 1 - good, group=f"f{g}")]
    for g in range(shared):
        good = g % 2
        out += [_r(k, good, group=f"s{g}") for k in "abcdeh"] + [_r(k, 1 - good, group=f"s{g}") for k in "xy"]
    return out


def test_two_colluders_cannot_frame_an_honest_key_and_are_taken_themselves():
    ratings = _framing(8, 4)
    scores = {d.key_id: d for d in disagreement_scores(ratings)}
    # h: 8 framed disagreements + 4 agreements; q = 1/2 -> expected 6, variance 3 -> z = 2 / sqrt(3)
    assert (scores["h"].n, scores["h"].disagreements) == (12, 8) and scores["h"].z == pytest.approx(2 / math.sqrt(3))
    # x: framed groups are ties (y vs h); shared: 4 disagreements of 4 -> z = (4 - 2) / 1 = 2
    assert (scores["x"].n, scores["x"].disagreements, scores["x"].z) == (4, 4, 2.0)

    # uncorroborated (1 key is enough), h is over 1.0 with x and y
    _, alone = find_suspects(ratings, 1.0, 4, min_corroborating_keys=1)
    assert [s.score.key_id for s in alone] == ["h", "x", "y"]

    _, found = find_suspects(ratings, 1.0, 4, min_corroborating_keys=3)
    assert [s.score.key_id for s in found] == ["x", "y"]
    x = found[0]
    # x's accusers: a..e and h, once per shared group (4 each); the top two by key id are left out
    assert x.left_out == ("a", "b")
    # again without a, b: c, d, e, h say good, y says bad -> 4/5: still 4 disagreements of 4
    assert (x.corroborated.n, x.corroborated.disagreements, x.corroborated.z) == (4, 4, 2.0)


def test_an_honest_key_framed_by_two_is_scored_without_them():
    # h's top accusers are x and y (8 framed + 0 shared groups each); without them the framed groups have no
    # consensus and the shared ones agree with h: z < 0
    _, found = find_suspects(_framing(8, 4), 1.0, 4, min_corroborating_keys=3)
    assert "h" not in {s.score.key_id for s in found}
    # three colluders are three keys: min_corroborating_keys = 3 no longer protects h, 4 does
    ratings = _framing(8, 4) + [_r("w", 1 - int(r.group[1:]) % 2, group=r.group) for r in _framing(8, 0) if r.key_id == "h"]
    assert "h" in {s.score.key_id for s in find_suspects(ratings, 1.0, 4, min_corroborating_keys=3)[1]}
    assert "h" not in {s.score.key_id for s in find_suspects(ratings, 1.0, 4, min_corroborating_keys=4)[1]}


def test_quarantined_keys_do_not_accuse():
    # once x and y are quarantined they vote nowhere: h's framed groups have no consensus
    scores, found = find_suspects(_framing(8, 4), 1.0, 4, min_corroborating_keys=1, exclude_from_consensus={"x", "y"})
    assert "h" not in {s.score.key_id for s in found}
    h = {d.key_id: d for d in scores}["h"]
    assert (h.n, h.disagreements) == (4, 0)


def test_off_and_bad_settings():
    assert find_suspects(_framing(8, 4), 0.0, 1)[1] == []
    with pytest.raises(ValueError):
        Similarity(jaccard=0)


def _window(n: int, seed: int = 0) -> list[KeyRating]:
    """n ratings by 6 keys of near-copies of a few replies to a few prompts."""
    import random

    rng = random.Random(seed)
    base = {p: [tuple(rng.randrange(50) for _ in range(12)) for _ in range(4)] for p in ("p", "q", "r")}
    out = []
    for _ in range(n):
        p = rng.choice("pqr")
        tokens = list(rng.choice(base[p]))
        tokens[rng.randrange(12)] = rng.randrange(50)  # a near-copy
        out.append(_r(f"k{rng.randrange(6)}", rng.randrange(2), p, tuple(tokens)))
    return out


def test_remembered_groups_equal_fresh_ones_and_grow_with_the_window():
    ratings = _window(400)
    groups = ReplyGroups(Similarity())
    assert groups(ratings[:250]) == reply_groups(ratings[:250])
    # the window grows: the first 250 keep their groups and the whole equals grouping it afresh
    assert groups(ratings) == reply_groups(ratings)
    # and find_suspects over a remembered grouping scores exactly as over a fresh one
    assert find_suspects(ratings, 1.0, 5, 2, groups=groups) == find_suspects(ratings, 1.0, 5, 2)


def test_remembered_groups_start_over_past_their_bound_and_refuse_another_similarity():
    ratings = _window(300, seed=1)
    groups = ReplyGroups(Similarity(), max_replies=50)
    groups(ratings[:200])
    assert groups(ratings[200:]) == reply_groups(ratings[200:])  # started over: grouped afresh
    with pytest.raises(ValueError):
        find_suspects(ratings, 1.0, 5, 2, similarity=EXACT, groups=groups)
