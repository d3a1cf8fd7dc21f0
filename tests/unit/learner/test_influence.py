"""The influence caps (learner/influence.py): per key per batch, per key per sliding time window, the
counters, and forgetting entries past a cursor that went back."""

from __future__ import annotations

import pytest

from liveloop.learner.config import LearnerConfig
from liveloop.learner.influence import InfluenceCaps, InfluenceLimits, KeyedRating


def _offer(caps: InfluenceCaps, ratings: list[tuple[int, str, float]]) -> list[bool]:
    plan = caps.plan()
    got = [plan.offer(KeyedRating(*r)) for r in ratings]
    caps.commit(plan)
    return got


def test_limits_come_from_the_learner_config_and_are_validated():
    cfg = LearnerConfig(max_per_key_per_batch=2, max_per_key_per_window=7, influence_window_seconds=60.0)
    assert InfluenceLimits.from_config(cfg) == InfluenceLimits(2, 7, 60.0)
    with pytest.raises(ValueError):
        InfluenceCaps(InfluenceLimits(per_batch=0))


def test_at_most_per_batch_samples_of_one_key_in_one_step():
    caps = InfluenceCaps(InfluenceLimits(per_batch=2, per_window=0))
    got = _offer(caps, [(1, "a", 0.0), (2, "a", 0.0), (3, "b", 0.0), (4, "a", 0.0), (5, "b", 0.0)])
    assert got == [True, True, True, False, True]
    # the next batch starts afresh for the per-batch cap (no window cap here)
    assert _offer(caps, [(6, "a", 1.0), (7, "a", 1.0)]) == [True, True]
    assert caps.stats()["learner/capped_ratings"] == 1.0 and caps.stats()["learner/capped_per_batch"] == 1.0


def test_at_most_per_window_trained_samples_of_one_key_in_any_window():
    caps = InfluenceCaps(InfluenceLimits(per_batch=1, per_window=2, window_seconds=10.0))
    assert _offer(caps, [(1, "a", 0.0), (2, "b", 0.0)]) == [True, True]
    assert _offer(caps, [(3, "a", 4.0)]) == [True]
    assert _offer(caps, [(4, "a", 9.0), (5, "b", 9.0)]) == [False, True]  # a has 0 and 4 in (-1, 9]; b only 0
    assert _offer(caps, [(6, "b", 9.5)]) == [False]  # b has 0 and 9 in (-0.5, 9.5]
    assert caps.in_window("a") == 2 and caps.in_window("b") == 2


def test_the_window_counts_only_trained_samples():
    caps = InfluenceCaps(InfluenceLimits(per_batch=1, per_window=2, window_seconds=10.0))
    assert _offer(caps, [(1, "a", 0.0)]) == [True]
    assert _offer(caps, [(2, "a", 4.0)]) == [True]
    assert _offer(caps, [(3, "a", 9.0)]) == [False]  # 0 and 4 are in (-1, 9]
    assert _offer(caps, [(4, "a", 10.0)]) == [True]  # (0, 10]: only 4 (0 has left, 9 was never trained)
    assert _offer(caps, [(5, "a", 13.0)]) == [False]  # (3, 13]: 4 and 10
    assert _offer(caps, [(6, "a", 14.5)]) == [True]  # (4.5, 14.5]: only 10
    s = caps.stats()
    assert s["learner/capped_ratings"] == 2.0 and s["learner/capped_per_window"] == 2.0


def test_a_batch_counts_its_own_samples_against_the_window():
    caps = InfluenceCaps(InfluenceLimits(per_batch=5, per_window=2, window_seconds=10.0))
    assert _offer(caps, [(1, "a", 0.0), (2, "a", 1.0), (3, "a", 2.0), (4, "b", 2.0)]) == [True, True, False, True]


def test_an_uncommitted_plan_changes_nothing():
    caps = InfluenceCaps(InfluenceLimits(per_batch=1, per_window=1, window_seconds=10.0))
    plan = caps.plan()
    assert plan.offer(KeyedRating(1, "a", 0.0)) and not plan.offer(KeyedRating(2, "a", 0.0))
    assert caps.in_window("a") == 0 and caps.stats()["learner/capped_ratings"] == 0.0
    assert _offer(caps, [(1, "a", 0.0)]) == [True]


def test_forget_after_drops_what_a_cursor_going_back_will_read_again():
    caps = InfluenceCaps(InfluenceLimits(per_batch=1, per_window=2, window_seconds=100.0))
    for i in range(1, 3):
        assert _offer(caps, [(i, "a", float(i))]) == [True]
    assert _offer(caps, [(3, "a", 3.0)]) == [False]
    caps.forget_after(1)  # a rollback moved the learner back to cursor 1: rating 2 will be read again
    assert caps.in_window("a") == 1
    assert _offer(caps, [(2, "a", 2.0)]) == [True]
