"""Recomputed activations (`[learner] recompute_over_tokens`, learner/recompute.py) change a step's memory,
not its update: two learners from the same start on the same rated replies of the tiny model, one
recomputing every batch and one none, end with the same weights and optimizer state and the same
metrics; the recomputing one counts its steps, and its layers are back as they were after each step."""

from __future__ import annotations

from transformers.modeling_layers import GradientCheckpointingLayer

import pytest
import torch

from liveloop.learner.online import OnlineLearner

from .test_step_equivalence import VARIANTS, _differences, _run, _tensors, replies  # noqa: F401 (the fixture)


@pytest.mark.parametrize("threshold", [1, 10**6])
def test_recomputing_a_batch_gives_the_same_update(threshold, tmp_path, model_dir, replies):  # noqa: F811
    overrides = VARIANTS["default_b4"]
    plain, plain_metrics = _run(OnlineLearner, tmp_path, "plain", model_dir, replies, overrides)
    again, again_metrics = _run(OnlineLearner, tmp_path, "again", model_dir, replies, overrides | {"recompute_over_tokens": threshold})
    assert again.state.step == plain.state.step >= 3
    recomputing = threshold == 1
    assert again.recomputed_steps == (again.state.step if recomputing else 0)
    assert [m.pop("learner/recomputed_steps") for m in again_metrics] == (
        [float(i + 1) for i in range(len(again_metrics))] if recomputing else [0.0] * len(again_metrics)
    )
    for model in (again.policy, again.critic.model):  # nothing left switched on
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        assert layers and not any(layer.gradient_checkpointing for layer in layers)
    differences = _differences(_tensors(plain), _tensors(again))
    if differences:  # a recomputed forward may round differently: then only by float noise
        a, b = _tensors(plain), _tensors(again)
        for k in differences:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7)
    for a, b in zip(plain_metrics, again_metrics):
        assert a.keys() == b.keys()
        assert a["learner/batch_size"] == b["learner/batch_size"]
        assert a["learner/step_kl"] == pytest.approx(b["learner/step_kl"], rel=1e-4, abs=1e-9)
