"""SAO's advantage levers (`[learner] baseline = "running_mean"`, `advantage_norm = "running"`) on the
tiny MoE against a real SQLite store: the learner steps on real rated responses, reports the lever's
metric, and with the running-mean baseline its critic still trains."""

from __future__ import annotations

import math

import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner


def _learner(store, tmp_path, model_dir, **kw) -> OnlineLearner:
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=2, publish_every_seconds=3600, **kw)
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def test_running_mean_baseline_steps_and_the_critic_still_trains(store, tmp_path, model_dir, rate):
    rate(store, 4)  # rewards 0, 1, 0, 1 in arrival order
    learner = _learner(store, tmp_path, model_dir, baseline="running_mean", baseline_horizon=100)
    critic_before = {k: v.clone() for k, v in learner.critic.model.state_dict().items()}
    seen = []
    for _ in range(4):
        assert learner.step()
        seen.append(learner.state.last_metrics["learner/baseline"])
    # each rating's baseline is the mean of the rewards before it: none -> 0, [0], [0, 1], [0, 1, 0]
    assert seen == pytest.approx([0.0, 0.0, 0.5, 1 / 3])
    assert "learner/advantage_scale" not in learner.state.last_metrics
    assert any(not torch.equal(critic_before[k], v) for k, v in learner.critic.model.state_dict().items())
    assert [v.version for v in store.versions.versions_with_status("published")] == [1, 2]


def test_running_normalisation_steps_and_reports_its_scale(store, tmp_path, model_dir, rate):
    rate(store, 3)
    learner = _learner(store, tmp_path, model_dir, advantage_norm="running", advantage_norm_floor=0.05)
    scales = []
    for _ in range(3):
        assert learner.step()
        scales.append(learner.state.last_metrics["learner/advantage_scale"])
    assert all(math.isfinite(s) and s >= 0.05 for s in scales)
    assert "learner/baseline" not in learner.state.last_metrics
    assert learner.state.skipped_steps == 0 and "learner/grad_norm" in learner.state.last_metrics
    learner.reload()  # a rollback's reload: the running state starts afresh
    assert learner.method.advantage_ms.count == 0
