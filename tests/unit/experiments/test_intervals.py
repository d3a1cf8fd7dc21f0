"""Intervals over seeds (experiments/intervals.py), by hand."""

from __future__ import annotations

import math

import pytest

from liveloop.experiments.intervals import mean_ci, median_ci, t95


def test_the_interval_of_five_seeds_uses_t_with_four_degrees_of_freedom():
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    i = mean_ci(values)
    half = 2.776 * math.sqrt(0.025) / math.sqrt(5)  # sample variance of 0.1..0.5 is 0.025
    assert (i.mean, i.n) == (pytest.approx(0.3), 5)
    assert i.low == pytest.approx(0.3 - half) and i.high == pytest.approx(0.3 + half)
    assert str(i) == f"0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}]"


def test_equal_values_have_a_zero_width_interval_and_one_value_none():
    i = mean_ci([1.0, 1.0, 1.0])
    assert (i.low, i.high) == (1.0, 1.0)
    one = mean_ci([0.4])
    assert (one.mean, one.low, one.high) == (0.4, None, None) and str(one) == "0.400"
    with pytest.raises(ValueError):
        mean_ci([])


def test_t_quantiles_fall_towards_the_normal():
    assert t95(4) == 2.776 and t95(1) == 12.706 and t95(100) == 1.96
    assert all(t95(d) > t95(d + 1) for d in range(1, 30))
    with pytest.raises(ValueError):
        t95(0)


def test_the_median_of_five_seeds_has_min_and_max_as_its_interval():
    i = median_ci([90, 40, 60, 50, 70])
    assert (i.median, i.low, i.high, i.n) == (60, 40, 90, 5)
    assert i.coverage == pytest.approx(30 / 32)  # P(1 <= Binomial(5, 1/2) <= 4)
    assert str(i) == "60 [40, 90]"


def test_runs_past_the_cap_sort_last_and_open_the_interval():
    i = median_ci([None, 40, None, 50, 70])
    assert (i.median, i.low, i.high) == (70, 40, None) and str(i) == "70 [40, >cap]"  # 40, 50, 70, -, -
    assert median_ci([None, None, 10]).median is None
    even = median_ci([10, 20, 30, None])
    assert even.median == 25 and even.high is None


def test_more_seeds_narrow_the_order_statistics():
    values = list(range(1, 21))  # n = 20: [x(6), x(15)] covers 0.959, [x(7), x(14)] only 0.885
    i = median_ci(values)
    assert (i.low, i.high) == (6, 15) and i.coverage == pytest.approx(0.9586, abs=1e-4)
    with pytest.raises(ValueError):
        median_ci([])
