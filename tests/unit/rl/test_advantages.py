"""Hand-computed GAE over a multi-turn trace with observation tokens in the middle, the baselines, and
the one group-normalisation convention (unbiased std, rows are groups, no signal -> 0) that the learner's
GRPO baselines and BGPO share."""

import math

import numpy as np
import pytest
import torch

from liveloop.rl.advantages import (
    gae_skip_observations,
    group_normalized_advantages,
    length_adaptive_lambda,
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
