"""Hand-computed GAE over a multi-turn trace with observation tokens in the middle, the baselines, the
one group-normalisation convention (unbiased std, rows are groups, no signal -> 0) that the learner's
GRPO baselines and BGPO share, and SAO's levers: the running-mean baseline and running-RMS normalisation."""

import math

import numpy as np
import pytest
import torch

from liveloop.rl.advantages import (
    RunningMean,
    constant_baseline_gae,
    gae_skip_observations,
    group_normalized_advantages,
    length_adaptive_lambda,
    normalize_by_running_rms,
    running_mean_baselines,
    sliding_window_advantage,
)

# tokens:        a0    a1   obs  obs   a4
VALUES = torch.tensor([0.5, 0.4, 9.0, 9.0, 0.2])
MASK = torch.tensor([1, 1, 0, 0, 1])


def test_gae_skips_observation_tokens_lambda_1():
    adv, ret = gae_skip_observations(VALUES, 1.0, MASK, gamma=1.0, lam=1.0)
    # a4: delta = 1 + 0 - 0.2 = 0.8                      A = 0.8
    # a1: next(a1) = a4 (obs skipped): delta = 0 + 0.2 - 0.4 = -0.2   A = -0.2 + 0.8 = 0.6
    # a0: delta = 0 + 0.4 - 0.5 = -0.1                    A = -0.1 + 0.6 = 0.5
    assert adv.tolist() == pytest.approx([0.5, 0.6, 0.0, 0.0, 0.8])
    # lambda 1: returns = A + V = the Monte-Carlo return 1.0 on every action token; 9.0 is never used
    assert ret.tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0])


def test_gae_lambda_half():
    adv, _ = gae_skip_observations(VALUES, 1.0, MASK, gamma=1.0, lam=0.5)
    # a4: 0.8;  a1: -0.2 + 0.5 * 0.8 = 0.2;  a0: -0.1 + 0.5 * 0.2 = 0.0
    assert adv.tolist() == pytest.approx([0.0, 0.2, 0.0, 0.0, 0.8], abs=1e-6)


def test_gae_reward_zero_and_gamma():
    adv, _ = gae_skip_observations(torch.tensor([1.0, 1.0]), 0.0, torch.tensor([1, 1]), gamma=0.5, lam=1.0)
    # t1: 0 + 0.5*0 - 1 = -1;  t0: 0 + 0.5*1 - 1 = -0.5, A0 = -0.5 + 0.5*1*(-1) = -1.0
    assert adv.tolist() == pytest.approx([-1.0, -1.0])


def test_length_adaptive_lambda():
    assert length_adaptive_lambda(100, alpha=0.05) == pytest.approx(0.8)  # 1 - 1/(0.05*100)
    assert length_adaptive_lambda(400, alpha=0.05) == pytest.approx(0.95)
    assert length_adaptive_lambda(10, alpha=0.05) == 0.0  # 1 - 1/0.5 < 0 -> floored
    assert length_adaptive_lambda(0) == 0.0


def test_sliding_window():
    adv, m = sliding_window_advantage(1.0, torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]))
    assert adv == pytest.approx(0.4) and m["learner/baseline"] == pytest.approx(0.6)  # 1 - 3/5
    assert sliding_window_advantage(0.0, torch.tensor([]))[0] == 0.0


def test_group_normalization_hand_computed():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.57735
    # A = +-0.5 / 0.57735 = +-0.86603
    # group [1, 0]: mean 0.5, unbiased std sqrt(0.5) -> A = +-0.5 / 0.70711 = +-0.70711
    # group [3, 1, 2]: mean 2, unbiased std sqrt((1 + 1 + 0) / 2) = 1 -> A = [1, -1, 0]
    a = group_normalized_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert a[0].tolist() == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-5)
    b = group_normalized_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    assert b[0].tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)])
    c = group_normalized_advantages(torch.tensor([[3.0, 1.0, 2.0]]))
    assert c[0].tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_group_normalization_rows_are_independent_groups():
    rows = group_normalized_advantages(torch.tensor([[1.0, 0.0], [3.0, 1.0]]))
    # [3, 1]: mean 2, unbiased std sqrt(2) -> +-1 / sqrt(2): the same as [1, 0] (scale-free)
    assert rows[1].tolist() == pytest.approx(rows[0].tolist())


def test_an_all_equal_group_gets_zero_advantages():
    same = group_normalized_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]))
    assert same[0].tolist() == [0.0, 0.0, 0.0] and same[1].tolist() == [0.0, 0.0, 0.0]
    assert same[2].abs().sum() > 0  # the other rows keep their signal
    # below eps counts as equal; eps is never added to the std
    assert group_normalized_advantages(torch.tensor([[1.0, 1.0 + 1e-8]])).tolist() == [[0.0, 0.0]]


def test_a_group_of_size_one_gets_zero_advantages():
    one = group_normalized_advantages(torch.tensor([[1.0], [0.0]]))
    assert one.tolist() == [[0.0], [0.0]] and not torch.isnan(one).any()


def test_learner_grpo_and_bgpo_use_the_one_group_normalisation():
    from liveloop.diffusion import bgpo
    from liveloop.learner import methods
    from liveloop.learner.config import GRPOConfig, LearnerConfig
    from liveloop.rl import advantages
    from liveloop.rl.batch import Sample, make_batch

    assert methods.group_normalized_advantages is advantages.group_normalized_advantages
    assert bgpo.group_normalized_advantages is advantages.group_normalized_advantages
    # and GRPO's batch (one group) gets the hand-computed values on every action token
    samples = [
        Sample(np.array([1]), np.array([5, 6]), np.zeros(2, np.float32), np.ones(2, np.uint8), float(r), 0)
        for r in (1, 0, 0, 1)
    ]
    adv, _ = methods.GRPO(LearnerConfig(method="grpo", grpo=GRPOConfig(group_size=4))).advantages(make_batch(samples), None)
    assert adv[:, 0].tolist() == pytest.approx([0.86603, -0.86603, -0.86603, 0.86603], abs=1e-5)
    assert torch.equal(adv[:, 0], adv[:, 1])


def test_running_mean_is_the_plain_mean_up_to_the_horizon_then_an_ema():
    m = RunningMean()
    for x in (1.0, 0.0, 1.0):
        m = m.add(x, horizon=3)
    assert (m.value, m.count) == (pytest.approx(2 / 3), 3)  # plain mean of 1, 0, 1
    m = m.add(0.0, horizon=3)  # weight 1/3 from here: 2/3 + (0 - 2/3) / 3 = 4/9
    assert m.value == pytest.approx(4 / 9)
    h2 = RunningMean().add(1.0, 2).add(0.0, 2).add(1.0, 2).add(0.0, 2)
    # 1 -> (1 + 0) / 2 = 0.5 -> 0.5 + (1 - 0.5) / 2 = 0.75 -> 0.75 + (0 - 0.75) / 2 = 0.375
    assert h2.value == pytest.approx(0.375)
    assert RunningMean().value == 0.0 and RunningMean().add(5.0, 100).value == 5.0  # immutable, first = itself


def test_running_mean_baselines_use_only_earlier_rewards():
    baselines, state = running_mean_baselines([1.0, 0.0, 1.0], RunningMean(), horizon=2)
    assert baselines == pytest.approx([0.0, 1.0, 0.5])  # none yet -> 0; then 1; then (1 + 0) / 2
    assert (state.value, state.count) == (pytest.approx(0.75), 3)  # 0.5 + (1 - 0.5) / 2
    more, _ = running_mean_baselines([0.0], state, horizon=2)
    assert more == pytest.approx([0.75])  # the state carries over between batches


def test_constant_baseline_gae_is_r_minus_baseline_at_lambda_1():
    adv = constant_baseline_gae(0.25, 1.0, MASK, gamma=1.0, lam=1.0)
    # a4: 1 - 0.25 = 0.75; a1 (next = a4): 0 + 0.25 - 0.25 + 0.75 = 0.75; a0 likewise; obs 0
    assert adv.tolist() == pytest.approx([0.75, 0.75, 0.0, 0.0, 0.75])
    half = constant_baseline_gae(0.25, 1.0, MASK, gamma=1.0, lam=0.5)
    # a4: 0.75; a1: 0 + 0.5 * 0.75 = 0.375; a0: 0.5 * 0.375 = 0.1875
    assert half.tolist() == pytest.approx([0.1875, 0.375, 0.0, 0.0, 0.75])
    low = constant_baseline_gae(0.02, 0.0, torch.tensor([1, 1]), gamma=1.0, lam=1.0)
    assert low.tolist() == pytest.approx([-0.02, -0.02])  # a miss at a 2% base rate


def test_running_rms_normalisation_hand_computed():
    adv = torch.tensor([[2.0, 2.0, 0.0], [1.0, -1.0, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    out, scales, state = normalize_by_running_rms(adv, mask, RunningMean(), horizon=2, floor=0.05)
    # sample 0: mean square of (2, 2) = 4, the state 4 (the first sample's own scale), scale 2 -> (1, 1)
    # sample 1: mean square of (1, -1) = 1 (the 9 is not an action token), state (4 + 1) / 2 = 2.5,
    #           scale sqrt(2.5) = 1.58114 -> (0.63246, -0.63246, 9 / 1.58114 = 5.69210)
    # sample 2: no action tokens: left as it is, scale 1, the state unchanged
    assert scales == pytest.approx([2.0, math.sqrt(2.5), 1.0])
    assert out[0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert out[1, :2].tolist() == pytest.approx([0.63246, -0.63246], abs=1e-5)
    assert out[2].tolist() == [0.0, 0.0, 0.0]
    assert (state.value, state.count) == (pytest.approx(2.5), 2)
    assert adv[0].tolist() == [2.0, 2.0, 0.0]  # the input is not modified


def test_running_rms_scale_is_floored():
    out, scales, state = normalize_by_running_rms(
        torch.tensor([[0.001, -0.001]]), torch.tensor([[1, 1]]), RunningMean(), horizon=100, floor=0.05
    )
    # RMS 0.001 < floor 0.05: divided by 0.05, not by 0.001 (x20, not x1000)
    assert scales == [0.05] and out[0].tolist() == pytest.approx([0.02, -0.02])
    assert state.value == pytest.approx(1e-6)
