"""The guard's verdicts by hand: one vote per key (a key's positive share), the pooled one-sided test."""

from liveloop.monitor.guard import Tally, judge


def each(positive: int, n: int) -> Tally:
    """n ratings, one per key."""
    return Tally(n, positive, n, float(positive))


def test_guard_rolls_back_only_a_significantly_worse_version_with_enough_ratings():
    # 40/100 against the parent's 60/100: z = -2.83, one-sided p = 0.0023
    verdict = judge(5, 4, each(40, 100), each(60, 100), min_ratings=100, min_keys=5, p_value=0.01)
    assert verdict is not None and (verdict.version, verdict.parent) == (5, 4)
    assert abs(verdict.p_worse - 0.002339) < 1e-5 and (verdict.keys, verdict.parent_keys) == (100, 100)
    assert judge(5, 4, each(40, 100), each(60, 100), min_ratings=100, min_keys=5, p_value=0.001) is None  # not that significant
    assert judge(5, 4, each(39, 99), each(60, 100), min_ratings=100, min_keys=5, p_value=0.01) is None  # too few ratings yet
    assert judge(5, 4, each(60, 100), each(40, 100), min_ratings=100, min_keys=5, p_value=0.01) is None  # better, not worse
    assert judge(0, None, each(0, 500), each(0, 0), min_ratings=1, min_keys=1, p_value=0.5) is None  # the base has no parent


def test_one_key_rating_a_version_down_is_one_vote():
    # one key rates 100 replies of version 5 down; the parent had 100 honest keys at 60%: no verdict
    alone = Tally(100, 0, 1, 0.0)
    assert judge(5, 4, alone, each(60, 100), min_ratings=100, min_keys=5, p_value=0.01) is None
    # with four honest keys beside it (all up) it is still one vote of five: 4/5 against 60/100 is not worse
    five = Tally(104, 4, 5, 4.0)
    assert judge(5, 4, five, each(60, 100), min_ratings=100, min_keys=5, p_value=0.01) is None
