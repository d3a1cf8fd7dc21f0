import math

import pytest

from liveloop.monitor.stats import compare_rates, wilson, z_for


def test_wilson_matches_the_hand_computed_interval():
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416, half 1.96 * sqrt(0.016 + 0.009604) / 1.38416
    r = wilson(8, 10)
    assert r.value == 0.8
    assert r.low == pytest.approx(0.4902, abs=1e-4)
    assert r.high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_edges():
    assert wilson(0, 0).as_dict() == {"n": 0, "positive": 0, "rate": None, "low": 0.0, "high": 1.0}
    zero, full = wilson(0, 20), wilson(20, 20)
    assert zero.low == 0.0 and 0 < zero.high < 0.2
    assert full.high == 1.0 and 0.8 < full.low < 1
    assert wilson(50, 100, 0.99).low < wilson(50, 100, 0.9).low
    with pytest.raises(ValueError):
        wilson(3, 2)
    with pytest.raises(ValueError):
        z_for(1.0)


def test_two_proportion_test_by_hand():
    # 60/100 vs 40/100: pooled 0.5, se = sqrt(0.25 * 0.02) = 0.0707107, z = 2.828427
    c = compare_rates(60, 100, 40, 100)
    assert c.difference == pytest.approx(0.2)
    assert c.z == pytest.approx(2.828427, abs=1e-5)
    assert c.p_two_sided == pytest.approx(0.004678, abs=1e-5)
    assert c.p_worse == pytest.approx(0.997661, abs=1e-5)
    worse = compare_rates(40, 100, 60, 100)
    assert worse.p_worse == pytest.approx(1 - 0.997661, abs=1e-5)


def test_two_proportion_degenerate_cases():
    assert compare_rates(1, 1, 0, 0) is None
    same = compare_rates(10, 10, 5, 5)  # pooled rate 1: no variance, no evidence
    assert same.z == 0.0 and same.p_two_sided == 1.0
    assert math.isclose(compare_rates(5, 10, 5, 10).p_worse, 0.5)
