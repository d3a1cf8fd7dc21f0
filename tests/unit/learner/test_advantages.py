"""Hand-computed GAE over a multi-turn trace with observation tokens in the middle, and the baselines."""

import pytest
import torch

from liveloop.learner.advantages import (
    gae_skip_observations,
    group_normalized_advantage,
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


def test_group_normalization():
    adv, _ = group_normalized_advantage(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, population std 0.5 -> [1, -1, -1, 1]
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    same, _ = group_normalized_advantage(torch.tensor([1.0, 1.0, 1.0]))
    assert same.tolist() == [0.0, 0.0, 0.0]
