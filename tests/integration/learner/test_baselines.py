"""Each baseline method (`[learner] method`) takes real steps on the tiny MoE against a real SQLite
store and publishes versions through the same loop as SAO; GRPO waits for complete groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import GRPOConfig, LearnerConfig, SlidingWindowConfig
from liveloop.learner.online import OnlineLearner
from liveloop.store import FeedbackRecord, ResponseRecord, Store


@pytest.fixture(scope="module")
def base_logprobs(model_dir):
    """The base policy's own logprobs of a response: the behavior logprobs version 0 would log, so
    that ratios start at 1 (inside every mask and clip band)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(prompt, response):
        ids = torch.tensor([list(prompt) + list(response)])
        lp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
        return tuple(float(x) for x in lp.gather(1, torch.tensor(list(response))[:, None])[:, 0])

    return logprobs


def _rate(store: Store, n: int, logprobs, group_size: int = 1, start: int = 0) -> None:
    """n rated responses; with group_size > 1, consecutive ones share a prompt and a group tag."""
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        prompt = tuple(int(x) for x in np.random.default_rng(1000 + i // group_size).integers(5, 500, 6))
        response = tuple(int(x) for x in rng.integers(5, 500, 8))
        rec = ResponseRecord(
            f"r{i}", "k", "m", 0, "chat", prompt, response, logprobs(prompt, response), "stop", 1.0, 1.0, 1.0,
            request_meta={"group": f"g{i // group_size}"} if group_size > 1 else None,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", "k", int(rng.integers(0, 2))))


def _learner(store, tmp_path, model_dir, **kw) -> OnlineLearner:
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=2, publish_every_seconds=3600, **kw)
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def _changed(before: dict, learner: OnlineLearner) -> bool:
    return any(not np.array_equal(before[k], v.detach().numpy()) for k, v in learner.policy.state_dict().items())


def test_sliding_window_steps_without_a_critic(store, tmp_path, model_dir, base_logprobs):
    _rate(store, 4, base_logprobs)
    learner = _learner(store, tmp_path, model_dir, method="sliding_window", sliding_window=SlidingWindowConfig(window=3), kl_coef=0.1)
    assert learner.critic is None
    before = {k: v.clone().numpy() for k, v in learner.policy.state_dict().items()}
    for _ in range(4):
        assert learner.step()
    assert not learner.step()  # nothing left
    assert _changed(before, learner)
    m = learner.state.last_metrics
    assert m["learner/window_fill"] == 3.0 and 0 <= m["learner/kept_fraction"] <= 1 and "learner/kl" in m
    assert [v.version for v in store.versions.versions_with_status("published")] == [1, 2]
    assert store.feedback.get_cursor("sao") == 4
    assert not (tmp_path / "versions" / "v000001" / "critic").exists()


@pytest.mark.parametrize("method", ["grpo", "grpo_dis"])
def test_grpo_methods_wait_for_groups(store, tmp_path, model_dir, method, base_logprobs):
    _rate(store, 5, base_logprobs, group_size=2)  # groups g0, g1 complete; g2 has 1 of 2
    learner = _learner(store, tmp_path, model_dir, method=method, grpo=GRPOConfig(group_size=2))
    assert learner.critic is None
    before = {k: v.clone().numpy() for k, v in learner.policy.state_dict().items()}
    assert learner.step() and learner.step()
    assert not learner.step()  # g2 incomplete: the learner waits
    m = learner.state.last_metrics
    assert m["learner/groups"] == 2.0 and m["learner/groups_pending"] == 1.0
    assert m["learner/group_wait_mean_seconds"] >= 0.0
    assert ("learner/clip_fraction" in m) == (method == "grpo") and ("learner/kept_fraction" in m) == (method == "grpo_dis")
    assert learner.state.samples == 4 and [v.version for v in store.versions.versions_with_status("published")] == [1]
    _rate(store, 1, base_logprobs, group_size=2, start=5)  # completes g2
    assert learner.step() and learner.state.samples == 6
    # a group with mixed rewards moves the weights (all-equal groups have zero advantage)
    assert _changed(before, learner) or all(
        len({f.reward for f, _ in store.feedback.rated_after(2 * g, 2)}) == 1 for g in range(3)
    )


def test_step_size_control_shrinks_a_rate_that_moves_the_policy_too_far(store, tmp_path, model_dir, base_logprobs):
    _rate(store, 4, base_logprobs)
    learner = _learner(store, tmp_path, model_dir, learning_rate=5e-2, max_learning_rate=5e-2, target_step_kl=1e-6)
    rates = []
    for _ in range(3):
        assert learner.step()
        m = learner.state.last_metrics
        assert m["learner/step_kl"] > 2e-6  # far above twice the target: the rate shrinks after every step
        assert m["learner/lr"] == (rates[-1] if rates else 5e-2)  # the rate this step was taken at
        rates.append(learner.learning_rate)
        assert [g["lr"] for g in learner.policy_opt.optimizer.param_groups] == [learner.learning_rate]
    assert rates == pytest.approx([5e-2 / 1.5, 5e-2 / 1.5**2, 5e-2 / 1.5**3])
    m = learner.state.last_metrics
    assert m["learner/entropy"] > 0 and m["learner/response_length"] == 8.0
    assert m["critic/value_error"] >= 0 and 0 <= m["learner/advantage_positive_fraction"] <= 1


@pytest.mark.parametrize("estimator", ["k3", "exact"])
def test_without_control_the_rate_and_kl_coef_stay_as_configured(store, tmp_path, model_dir, base_logprobs, estimator):
    _rate(store, 2, base_logprobs)
    learner = _learner(store, tmp_path, model_dir, learning_rate=1e-3, kl_coef=0.1, kl_estimator=estimator)
    assert learner.step() and learner.step()
    m = learner.state.last_metrics
    assert (learner.learning_rate, learner.kl_coef) == (1e-3, 0.1) and (m["learner/lr"], m["learner/kl_coef"]) == (1e-3, 0.1)
    assert m["learner/step_kl"] > 0 and m["learner/kl"] > 0  # the second step's policy has moved off the base


def test_the_adaptive_kl_coef_rises_while_the_policy_is_past_its_target(store, tmp_path, model_dir, base_logprobs):
    _rate(store, 3, base_logprobs)
    learner = _learner(store, tmp_path, model_dir, learning_rate=5e-2, max_learning_rate=5e-2, kl_coef=0.1,
                       kl_estimator="exact", target_kl_to_base=1e-6, kl_horizon=10)
    coefs = []
    for _ in range(3):
        assert learner.step()
        coefs.append(learner.kl_coef)
    assert coefs[0] == pytest.approx(0.1 * 0.98)  # the first step is at the base: KL 0, below target: -20% / 10
    assert coefs[1:] == pytest.approx([0.1 * 0.98 * 1.02, 0.1 * 0.98 * 1.02**2])  # then past it: +20% / 10 per sample


def test_the_trust_region_undoes_an_update_that_moves_the_policy_too_far(store, tmp_path, model_dir, base_logprobs):
    _rate(store, 2, base_logprobs)
    learner = _learner(store, tmp_path, model_dir, learning_rate=5e-2, max_learning_rate=5e-2, max_step_kl=1e-9)
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    assert learner.step()
    m = learner.state.last_metrics
    assert m["learner/step_kl"] > 1e-9 and m["learner/rejected_steps"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())  # undone exactly
    assert learner.state.updates_since_publish == 0
    learner.publish()
    assert store.versions.versions_with_status("published") == []  # nothing changed, nothing published
    assert store.feedback.get_cursor("sao") == 1  # the rating was consumed
