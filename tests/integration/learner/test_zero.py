"""DeepSpeed ZeRO for the learner, for real, in one process on CPU: one policy step under ZeRO gives
the same weights as the plain-torch step on the same batch, and the learner runs and publishes with
it. The first test compiles DeepSpeed's communication op once (~2 minutes, cached)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.rl.batch import Sample, make_batch, response_logprobs
from liveloop.rl.losses import sao_policy_loss
from liveloop.rl.optim import make_optimizer
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

pytestmark = pytest.mark.slow


def _batch():
    rng = np.random.default_rng(0)
    samples = [
        Sample(rng.integers(5, 500, 6), rng.integers(5, 500, 10), np.full(10, -3.0, np.float32), np.ones(10, np.uint8), float(i % 2), 0)
        for i in range(2)
    ]
    return make_batch(samples)


def _one_step(model_dir, stage: int) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = make_optimizer(model, lr=1e-3, max_grad_norm=1.0, zero_stage=stage, micro_batch=2)
    batch = _batch()
    logprobs = response_logprobs(opt.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch)
    behavior = logprobs.detach() - 0.1  # ratios e^0.1 ~ 1.105: inside the band, every token kept
    advantages = torch.linspace(-1, 1, batch.width).expand_as(logprobs)
    loss, _ = sao_policy_loss(logprobs, behavior, advantages, batch.action_mask, 0.3, 5.0)
    assert opt.step(loss) is not None
    with opt.full_parameters() as full:
        return {k: v.detach().clone() for k, v in full.state_dict().items()}


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_step_equals_torch_step(model_dir, stage):
    plain = _one_step(model_dir, 0)
    zero = _one_step(model_dir, stage)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    assert any(not torch.equal(start[k], plain[k]) for k in plain)  # the step did move the weights
    worst = max(float((plain[k] - zero[k]).abs().max()) for k in plain)
    if stage == 2:
        assert worst <= 1e-6, f"ZeRO-2 differs from plain torch by {worst}"
    else:
        # ZeRO-3's gradient hooks change the order in which a tensor's gradient contributions are
        # summed (~1e-8 apart); Adam's first step, ~lr * g / (|g| + eps), magnifies that on elements
        # whose gradient is near eps. Compare the whole update instead: it must agree to 1e-3.
        update = sum(float((plain[k] - start[k]).pow(2).sum()) for k in plain) ** 0.5
        error = sum(float((plain[k] - zero[k]).pow(2).sum()) for k in plain) ** 0.5
        assert error / update < 1e-3, f"ZeRO-3 update differs from plain torch by {error / update:.2e} (relative)"


def test_learner_runs_and_publishes_under_zero2(tmp_path, model_dir):
    store = Store(StoreConfig(url=f"sqlite:///{tmp_path / 'z.db'}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    for i in range(3):
        rec = ResponseRecord(f"r{i}", "k", "m", 0, "chat", (5, 6, 7), (8, 9, 10, 11), (-2.0, -2.0, -2.0, -2.0), "stop", 1.0, 1.0, 1.0)
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", i % 2))
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "v"), zero_stage=2, publish_every_steps=3)
    learner = OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=3)
    (version,) = store.versions.versions_with_status("published")
    assert version.samples_used == 3 and learner.state.skipped_steps == 0
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(version.checkpoint_path).state_dict()
    assert all(torch.equal(saved[k], v) for k, v in learner.policy.state_dict().items())
    store.close()
