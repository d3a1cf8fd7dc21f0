"""The learner's device and dtype (`[learner] device`, `dtype`, `master_weights`) and its adaptive batch,
on the tiny model and a real SQLite store. The CUDA paths run in bench/gpu_check.sh on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.learner.placement import DeviceUnavailable, placement
from liveloop.rl.optim import TorchOptimizer
from liveloop.store import FeedbackRecord, ResponseRecord, Store


def _rate_on_policy(store: Store, model_dir, n: int) -> None:
    """n rated responses whose behaviour logprobs are the base model's own (ratio 1: nothing masked)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        prompt, response = torch.randint(5, 500, (6,), generator=g), torch.randint(5, 500, (8,), generator=g)
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0, 5:-1].float()
        lps = torch.log_softmax(logits, -1).gather(1, response[:, None])[:, 0]
        store.feedback.write_batch([ResponseRecord(
            f"p{i}", "k", "m", 0, "chat", tuple(prompt.tolist()), tuple(response.tolist()),
            tuple(float(x) for x in lps), "stop", 1.0, 1.0, 1.0,
        )])
        store.feedback.put_feedback(FeedbackRecord(f"p{i}", "k", i % 2))


def _cfg(tmp_path, **kw) -> LearnerConfig:
    return LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=100, publish_every_seconds=3600, **kw)


def _dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in module.parameters()}


def test_auto_places_float32_on_the_cpu_here():
    place = placement(LearnerConfig())
    if torch.cuda.is_available():
        assert (place.device.type, place.dtype) == ("cuda", torch.bfloat16)
    else:
        assert (place.device.type, place.dtype) == ("cpu", torch.float32)
        with pytest.raises(DeviceUnavailable, match="no CUDA device"):
            placement(LearnerConfig(device="cuda"))
    assert placement(LearnerConfig(device="cpu", dtype="bfloat16")).dtype == torch.bfloat16


def test_bfloat16_learner_places_policy_critic_and_reference_and_trains(store, tmp_path, model_dir):
    _rate_on_policy(store, model_dir, 3)
    cfg = _cfg(tmp_path, device="cpu", dtype="bfloat16", kl_coef=0.1, gradient_checkpointing=True)
    learner = OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert _dtypes(learner.policy) == {torch.bfloat16}
    assert _dtypes(learner.reference) == {torch.bfloat16}
    assert _dtypes(learner.critic.model) == {torch.bfloat16}
    assert learner.policy.is_gradient_checkpointing
    before = [p.detach().clone() for p in learner.policy.parameters()]
    assert learner.step()
    metrics = learner.state.last_metrics
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("learner/"))
    changed = sum(not torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))
    assert changed > 0
    # mixed precision: the optimizer steps an fp32 copy and its moments are fp32
    opt = learner.policy_opt
    assert isinstance(opt, TorchOptimizer) and opt.master is not None
    assert {m.dtype for m in opt.master} == {torch.float32}
    state = next(iter(opt.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.float32
    # the bfloat16 weights are the fp32 copy rounded
    for m, p in zip(opt.master, opt.params):
        assert torch.equal(m.to(torch.bfloat16), p.detach())


def test_master_weights_off_keeps_bfloat16_optimizer_state(store, tmp_path, model_dir):
    _rate_on_policy(store, model_dir, 1)
    learner = OnlineLearner.resume(
        _cfg(tmp_path, device="cpu", dtype="bfloat16", master_weights=False), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    assert learner.policy_opt.master is None
    assert learner.step()
    state = next(iter(learner.policy_opt.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.bfloat16


def test_trust_region_undo_restores_the_master_copy_too():
    model = torch.nn.Linear(4, 2).to(torch.bfloat16)
    opt = TorchOptimizer(model, lr=0.1, max_grad_norm=1.0)
    saved = opt.snapshot()
    weights = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(1, 4, dtype=torch.bfloat16)).float().sum()
    assert opt.step(loss) is not None
    assert any(not torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    opt.restore(saved)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(torch.equal(m, s) for m, s in zip(opt.master, saved))


def test_one_step_trains_every_waiting_rating_up_to_the_max(store, tmp_path, model_dir, rate):
    rate(store, 10)
    learner = OnlineLearner.resume(
        _cfg(tmp_path, max_batch_size=4, max_per_key_per_batch=16), CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    sizes = []
    while learner.step():
        sizes.append(int(learner.state.last_metrics["learner/batch_size"]))
    assert sizes == [4, 4, 2] and learner.state.samples == 10 and learner.state.pending_cursor == 10
    rate(store, 1, start=10)
    assert learner.step() and learner.state.last_metrics["learner/batch_size"] == 1.0
