"""Step-size control and the adaptive KL coefficient, step by step with hand-computed values."""

from __future__ import annotations

import math

import pytest

from liveloop.rl.control import AdaptiveKLCoef, StepSizeControl


def test_step_size_moves_by_the_factor_outside_the_band_and_stays_inside_it():
    c = StepSizeControl(lr=1e-3, target_kl=0.01, min_lr=1e-5, max_lr=4e-3)
    assert c.update(0.05) == pytest.approx(1e-3 / 1.5)  # > 2 x target: smaller
    assert c.update(0.015) == pytest.approx(1e-3 / 1.5)  # inside [target/2, 2 target]: unchanged
    assert c.update(0.02) == pytest.approx(1e-3 / 1.5)  # exactly 2 x target: unchanged
    assert c.update(0.001) == pytest.approx(1e-3)  # < target / 2: larger
    for _ in range(10):
        c.update(0.0)
    assert c.lr == 4e-3  # the ceiling
    for _ in range(40):
        c.update(1.0)
    assert c.lr == 1e-5  # the floor
    assert c.update(math.nan) == 1e-5  # an unmeasurable step is treated as too large


def test_step_size_control_refuses_nonsense():
    with pytest.raises(ValueError):
        StepSizeControl(lr=1e-2, target_kl=0.01, min_lr=1e-5, max_lr=1e-3)
    with pytest.raises(ValueError):
        StepSizeControl(lr=1e-3, target_kl=0.0, min_lr=1e-5, max_lr=1e-2)


def test_adaptive_kl_coef_follows_ziegler_with_a_clipped_error():
    k = AdaptiveKLCoef(coef=0.1, target=0.5, horizon=100)
    assert k.update(1.0, n=1) == pytest.approx(0.1 * (1 + 0.2 / 100))  # error 1.0 clipped to 0.2
    assert k.update(0.45, n=10) == pytest.approx(0.1 * (1 + 0.2 / 100) * (1 - 0.1 * 10 / 100))  # error -0.1
    k = AdaptiveKLCoef(coef=0.1, target=0.5, horizon=1)
    for _ in range(200):
        k.update(0.0)
    assert k.coef == pytest.approx(1e-6, rel=1e-3)  # shrinks toward the floor while the policy stays close
