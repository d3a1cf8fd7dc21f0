"""SAO's advantage levers (learner/methods.py, `[learner] baseline` and `advantage_norm`): their config
(off by default, SAO only) and the advantages they give on tiny hand-made batches, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from liveloop.config import ConfigError, load_section
from liveloop.learner.config import LearnerConfig
from liveloop.learner.methods import SAO
from liveloop.rl.batch import Sample, make_batch

LAMBDA_1 = 1e12  # lambda_alpha: lambda_policy = 1 - 1 / (alpha L) = 1 to within 1e-12


def _close(t: torch.Tensor, expected: list) -> bool:
    return np.allclose(t.numpy(), np.array(expected, dtype=np.float64), atol=1e-6)


def _batch(*rewards: float):
    return make_batch([
        Sample(np.array([1, 2]), np.array([5, 6, 7]), np.full(3, -1.0, np.float32), np.ones(3, np.uint8), r, 0)
        for r in rewards
    ])


def test_the_levers_are_off_by_default_and_read_from_toml():
    c = LearnerConfig()
    assert (c.advantage_norm, c.baseline, c.advantage_norm_horizon, c.baseline_horizon) == ("none", "critic", 100, 100)
    assert c.advantage_norm_floor == 0.05
    t = load_section(
        LearnerConfig,
        {"advantage_norm": "running", "advantage_norm_horizon": 50, "advantage_norm_floor": 0.1,
         "baseline": "running_mean", "baseline_horizon": 20},
        "learner",
    )
    assert (t.advantage_norm, t.advantage_norm_horizon, t.advantage_norm_floor, t.baseline, t.baseline_horizon) == (
        "running", 50, 0.1, "running_mean", 20,
    )


def test_config_refuses_bad_levers():
    with pytest.raises(ConfigError, match="advantage_norm"):
        load_section(LearnerConfig, {"advantage_norm": "batch"}, "learner")
    with pytest.raises(ConfigError, match="baseline"):
        load_section(LearnerConfig, {"baseline": "prompt"}, "learner")
    for method in ("sliding_window", "grpo", "grpo_dis"):
        with pytest.raises(ValueError, match="SAO's levers"):
            LearnerConfig(method=method, advantage_norm="running")
        with pytest.raises(ValueError, match="SAO's levers"):
            LearnerConfig(method=method, baseline="running_mean")
    for bad in ({"advantage_norm_horizon": 0}, {"baseline_horizon": 0}, {"advantage_norm_floor": 0.0}):
        with pytest.raises(ValueError, match="horizon"):
            LearnerConfig(**bad)


def test_critic_baseline_is_unchanged_and_reports_no_lever_metrics():
    m = SAO(LearnerConfig(batch_size=3, lambda_alpha=LAMBDA_1))
    adv, ret = m.advantages(_batch(1.0, 0.0, 1.0), torch.full((3, 3), 0.9))
    # GAE at gamma = lambda = 1 against V = 0.9 on every token: A = r - 0.9; targets = r
    assert adv[:, 0].tolist() == pytest.approx([0.1, -0.9, 0.1]) and adv[:, 2].tolist() == pytest.approx([0.1, -0.9, 0.1])
    assert _close(ret, [[1.0] * 3, [0.0] * 3, [1.0] * 3])
    assert "learner/baseline" not in m.stats() and "learner/advantage_scale" not in m.stats()


def test_running_mean_baseline_replaces_the_critic_in_gae_but_not_its_targets():
    m = SAO(LearnerConfig(batch_size=3, lambda_alpha=LAMBDA_1, baseline="running_mean", baseline_horizon=2))
    values = torch.full((3, 3), 0.9)  # the critic's: ignored by the advantages, used by the targets
    adv, ret = m.advantages(_batch(1.0, 0.0, 1.0), values)
    # baselines: none yet -> 0; [1] -> 1; [1, 0] -> 0.5. A = r - baseline on every action token
    assert _close(adv, [[1.0] * 3, [-1.0] * 3, [0.5] * 3])
    assert _close(ret, [[1.0] * 3, [0.0] * 3, [1.0] * 3])  # the critic trains as before
    assert m.stats()["learner/baseline"] == pytest.approx(0.5)  # mean of (0, 1, 0.5)
    adv, _ = m.advantages(_batch(0.0), values[:1])
    # the state carries over: (1 + 0) / 2 = 0.5, then + (1 - 0.5) / 2 = 0.75 (horizon 2): A = 0 - 0.75
    assert _close(adv, [[-0.75] * 3]) and m.stats()["learner/baseline"] == pytest.approx(0.75)
    m.reset()  # a rollback's reload: the running state starts afresh
    adv, _ = m.advantages(_batch(1.0), values[:1])
    assert _close(adv, [[1.0] * 3])


def test_running_normalisation_divides_by_the_running_rms():
    m = SAO(LearnerConfig(batch_size=2, lambda_alpha=LAMBDA_1, advantage_norm="running", advantage_norm_horizon=10))
    adv, ret = m.advantages(_batch(1.0, 0.0), torch.full((2, 3), 0.8))
    # raw A: 0.2 and -0.8 on every token. Sample 0: mean square 0.04 -> scale 0.2 -> 1.0
    # sample 1: mean square 0.64, state (0.04 + 0.64) / 2 = 0.34, scale sqrt(0.34) = 0.58310 -> -1.37199
    assert adv[0].tolist() == pytest.approx([1.0] * 3)
    assert adv[1].tolist() == pytest.approx([-0.8 / math.sqrt(0.34)] * 3)
    assert _close(ret, [[1.0] * 3, [0.0] * 3])  # targets are not normalised
    assert m.stats()["learner/advantage_scale"] == pytest.approx((0.2 + math.sqrt(0.34)) / 2)


def test_both_levers_at_a_low_base_rate():
    m = SAO(LearnerConfig(lambda_alpha=LAMBDA_1, baseline="running_mean", advantage_norm="running", advantage_norm_floor=0.5))
    values = torch.zeros(1, 3)
    a0, _ = m.advantages(_batch(0.0), values)  # baseline 0: A = 0, RMS 0 -> the floor 0.5: 0 / 0.5 = 0
    assert a0.tolist() == [[0.0] * 3] and m.stats()["learner/advantage_scale"] == 0.5
    a1, _ = m.advantages(_batch(1.0), values)
    # baseline 0 (mean of [0]), A = 1; mean squares (0 + 1) / 2 = 0.5, scale sqrt(0.5) -> 1 / 0.70711 = 1.41421
    assert _close(a1, [[math.sqrt(2)] * 3])
    assert m.stats()["learner/baseline"] == 0.0
