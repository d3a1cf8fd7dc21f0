"""Step-size control, the adaptive KL coefficient and the trust region, step by step with hand-computed values."""

from __future__ import annotations

import math

import pytest

from liveloop.rl.control import AdaptiveKLCoef, StepSizeControl, TrustRegionVerdict, trust_region


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


# -- the trust region: cut-backs, jumps and overshoots ---------------------------------------------
def _recording(kl_of):
    """kl_at that records which fractions of the update were measured."""
    asked = []

    def kl_at(scale):
        asked.append(scale)
        return kl_of(scale)

    return kl_at, asked


def test_an_update_within_the_region_stands_whole_and_nothing_is_remeasured():
    kl_at, asked = _recording(lambda s: 0.01 * s * s)
    assert trust_region(kl_at, full_kl=0.01, max_kl=0.05) == TrustRegionVerdict(1.0, "within", 0.01)
    assert asked == []


def test_a_smooth_overshoot_is_cut_back_to_the_largest_fraction_within():
    # smooth: KL grows with the square of the step; full 0.8 -> at 1/2: 0.2, at 1/10: 0.008, at 1/100: 0.00008
    kl_at, _ = _recording(lambda s: 0.8 * s * s)
    v = trust_region(kl_at, full_kl=0.8, max_kl=0.05)
    assert (v.scale, v.kind) == (0.1, "cut") and v.kl == pytest.approx(0.008)
    # within at half: half stands
    assert trust_region(lambda s: 0.16 * s * s, full_kl=0.16, max_kl=0.05) == TrustRegionVerdict(0.5, "cut", 0.04)


def test_a_jump_where_the_policy_stands_lets_the_smallest_step_cross_it():
    # a step function: any fraction of the update crosses a 0.9-nat cliff (an MoE routing switch)
    v = trust_region(lambda s: 0.9 + 0.001 * s * s, full_kl=0.901, max_kl=0.05)
    assert (v.scale, v.kind) == (0.01, "jump") and v.kl == pytest.approx(0.9 + 1e-7)


def test_an_overshoot_no_cut_back_tames_is_undone():
    # smooth but steep: at 1/100 still 1e-4 * 1e4 = 1 nat, which is 1/100 of the 100 nats at 1/10: no jump
    v = trust_region(lambda s: 1e4 * s * s, full_kl=1e4, max_kl=0.05)
    assert v == TrustRegionVerdict(0.0, "undone", 0.0)


def test_cut_backs_are_measured_only_until_one_is_within():
    kl_at, asked = _recording(lambda s: 0.16 * s * s)  # 1/2 of the update: 0.04, within 0.05
    assert trust_region(kl_at, full_kl=0.16, max_kl=0.05) == TrustRegionVerdict(0.5, "cut", 0.04)
    assert asked == [0.5]
    kl_at, asked = _recording(lambda s: 0.8 * s * s)  # 1/2: 0.2, 1/10: 0.008
    assert trust_region(kl_at, full_kl=0.8, max_kl=0.05).scale == 0.1 and asked == [0.5, 0.1]
    kl_at, asked = _recording(lambda s: 1e4 * s * s)  # none within: all three measured, then undone
    assert trust_region(kl_at, full_kl=1e4, max_kl=0.05).kind == "undone" and asked == [0.5, 0.1, 0.01]
