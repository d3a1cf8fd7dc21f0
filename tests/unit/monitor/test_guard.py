from liveloop.monitor.guard import judge


def test_guard_rolls_back_only_a_significantly_worse_version_with_enough_ratings():
    # 40/100 against the parent's 60/100: z = -2.83, one-sided p = 0.0023
    verdict = judge(5, 4, (40, 100), (60, 100), min_ratings=100, p_value=0.01)
    assert verdict is not None and (verdict.version, verdict.parent) == (5, 4)
    assert abs(verdict.p_worse - 0.002339) < 1e-5
    assert judge(5, 4, (40, 100), (60, 100), min_ratings=100, p_value=0.001) is None  # not that significant
    assert judge(5, 4, (39, 99), (60, 100), min_ratings=100, p_value=0.01) is None  # too few ratings yet
    assert judge(5, 4, (60, 100), (40, 100), min_ratings=100, p_value=0.01) is None  # better, not worse
    assert judge(0, None, (0, 500), (0, 0), min_ratings=1, p_value=0.5) is None  # the base has no parent
