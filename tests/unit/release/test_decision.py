"""The gate's verdicts, by hand: the pooled two-proportion z-test on one vote per key, one-sided, at the
config's p-value. `C(ratings, positive)` is traffic of one rating per key (votes = positive ratings)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from liveloop.release.config import EvaluationConfig, ReleaseConfig
from liveloop.release.decision import decide

CONFIG = ReleaseConfig(mode="canary", min_ratings=30, p_value=0.05)


@dataclass(frozen=True)
class C:
    ratings: int
    positive: int
    keys: int = -1  # -1: one rating per key
    votes: float = -1.0

    def __post_init__(self):
        if self.keys < 0:
            object.__setattr__(self, "keys", self.ratings)
            object.__setattr__(self, "votes", float(self.positive))


def test_canary_waits_for_min_ratings():
    d = decide(C(29, 29), C(100, 10), True, "canary", CONFIG)
    assert d.action == "wait" and "29 of 30" in d.reason


def test_canary_holds_a_candidate_rated_significantly_worse():
    # 10/30 against 60/100: pooled 70/130 = 0.5385; se = sqrt(0.5385 * 0.4615 * (1/30 + 1/100)) = 0.10378;
    # z = (0.3333 - 0.6) / 0.10378 = -2.570; p_worse = Phi(-2.570) = 0.0051 < 0.05
    d = decide(C(30, 10), C(100, 60), True, "canary", CONFIG)
    assert d.action == "hold" and d.p_worse == pytest.approx(0.00508, abs=2e-4)


def test_canary_promotes_one_not_significantly_worse_once_evaluated():
    # 15/30 against 60/100: pooled 75/130 = 0.5769, se = sqrt(0.5769 * 0.4231 * 0.04333) = 0.10284;
    # z = -0.1 / 0.10284 = -0.972; p_worse = Phi(-0.972) = 0.165 >= 0.05
    d = decide(C(30, 15), C(100, 60), True, "canary", CONFIG)
    assert d.action == "promote" and d.p_worse == pytest.approx(0.165, abs=1e-3)
    assert decide(C(30, 15), C(100, 60), None, "canary", CONFIG).action == "wait"  # evaluation still running


def test_a_stricter_p_value_lets_the_same_counts_through():
    assert decide(C(30, 10), C(100, 60), True, "canary", replace(CONFIG, p_value=0.001)).action == "promote"


def test_a_failed_evaluation_holds_at_once_in_canary_and_gated():
    assert decide(C(0, 0), C(100, 60), False, "canary", CONFIG).action == "hold"
    assert decide(C(0, 0), C(0, 0), False, "gated", CONFIG).action == "hold"


def test_gated_follows_the_evaluation_alone():
    assert decide(C(0, 0), C(0, 0), None, "gated", CONFIG).action == "wait"
    assert decide(C(0, 0), C(0, 0), True, "gated", CONFIG).action == "promote"


def test_canary_without_an_evaluation_counts_it_as_passed():
    off = replace(CONFIG, evaluation=EvaluationConfig(enabled=False))
    assert decide(C(30, 15), C(100, 60), None, "canary", off).action == "promote"


def test_no_live_ratings_to_compare_with_waits():
    assert decide(C(40, 20), C(0, 0), True, "canary", CONFIG).action == "wait"


def test_immediate_always_promotes():
    assert decide(C(0, 0), C(0, 0), False, "immediate", CONFIG).action == "promote"


def test_one_key_rating_every_canary_reply_down_is_one_vote_and_waits():
    # 30 ratings, all down, from one key: 1 of 5 keys, no verdict (today's test on ratings would hold)
    d = decide(C(30, 0, keys=1, votes=0.0), C(100, 60), True, "canary", CONFIG)
    assert d.action == "wait" and "1 of 5 keys" in d.reason


def test_the_live_version_needs_min_keys_too():
    d = decide(C(30, 15), C(100, 60, keys=4, votes=2.4), True, "canary", CONFIG)
    assert d.action == "wait" and "4 of 5 keys" in d.reason


def test_votes_are_key_means_compared_as_one_rating_each():
    # candidate: 10 keys, 40 ratings, vote shares summing to 3.0; live: 10 keys summing to 8.0.
    # pooled 11/20 = 0.55; se = sqrt(0.55 * 0.45 * (1/10 + 1/10)) = 0.22249; z = (0.3 - 0.8) / 0.22249 = -2.247;
    # p_worse = Phi(-2.247) = 0.0123 < 0.05: held
    d = decide(C(40, 12, keys=10, votes=3.0), C(60, 48, keys=10, votes=8.0), True, "canary", CONFIG)
    assert d.action == "hold" and d.p_worse == pytest.approx(0.0123, abs=2e-4)
    # the same ratings, but one key cast 30 of them and 9 others one each (3 of those 9 up): 10 votes, 3.0 again
    same = decide(C(39, 3, keys=10, votes=3.0), C(60, 48, keys=10, votes=8.0), True, "canary", CONFIG)
    assert same.p_worse == pytest.approx(d.p_worse)
