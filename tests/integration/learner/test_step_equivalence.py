"""The learner's step (learner/online.py) is the same SAO step, bit for bit, as the step before issue 36
(learner/reference_step.py, the code of commit a4a7356): two learners from the same start on the same
rated replies of the tiny MoE, in a real SQLite store each, end with the same policy and critic weights,
the same AdamW moments, the same learning rate and KL coefficient, the same trust-region counts and the
same metrics after every step. Configs: the tiny model's shipped rule ([learner] and [critic] of the `tiny` preset)
at batch 1 and 4, a steep one whose updates the trust region cuts back and undoes, the k3 anchor without
step control, and no anchor at all. The comparison itself is shown to see a one-ulp difference."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from liveloop.config import load_config
from liveloop.learner.online import OnlineLearner
from liveloop.learner.reference_step import ReferenceLearner
from liveloop.rl.rollout import chat_prompt_ids, sample_reply
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

TOPICS = ("cats", "the sea", "rain", "bread", "the moon", "trains")
VARIANTS = {
    "default_b1": {"max_batch_size": 1},
    "default_b4": {"max_batch_size": 4, "max_per_key_per_batch": 100},
    "steep": {"learning_rate": 2e-2, "max_learning_rate": 2e-2, "max_step_kl": 1e-3, "max_batch_size": 2, "max_per_key_per_batch": 100},
    "k3_fixed": {"kl_estimator": "k3", "target_kl_to_base": 0.0, "target_step_kl": 0.0, "max_step_kl": 0.0, "max_batch_size": 2,
                 "max_per_key_per_batch": 100},
    "no_anchor": {"kl_coef": 0.0, "target_kl_to_base": 0.0, "target_step_kl": 0.0, "max_step_kl": 0.0, "max_batch_size": 1},
}


@pytest.fixture(scope="module")
def replies(model_dir):
    """12 replies of at most 16 tokens sampled from the tiny model (behaviour logprobs its own), rated 0/1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    out = []
    for i in range(12):
        prompt = chat_prompt_ids(tok, f"Tell me about {TOPICS[i % len(TOPICS)]}.")
        out.append((sample_reply(model, tok, prompt, 16, torch.Generator().manual_seed(i)), int(i % 3 == 0)))
    return out


def _store(path: Path, model_dir: Path, replies) -> Store:
    store = Store(StoreConfig(url=f"sqlite:///{path}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    for i, (r, reward) in enumerate(replies):
        rec = ResponseRecord(
            f"r{i}", f"k{i}", "m", 0, "chat", tuple(r.prompt_ids), tuple(r.response_ids), tuple(np.float32(r.logprobs).tolist()),
            "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(rec.id, rec.api_key_id, reward))
    return store


def _run(cls, tmp_path: Path, name: str, model_dir: Path, replies, overrides: dict):
    cfg = load_config("tiny")  # the tiny model's shipped rule (the default's, whole-policy)
    learner_cfg = dataclasses.replace(
        cfg.learner, checkpoint_dir=str(tmp_path / name / "versions"), publish_every_steps=10**6, publish_every_seconds=1e9, **overrides
    )
    store = _store(tmp_path / f"{name}.db", model_dir, replies)
    learner = cls.resume(
        learner_cfg, cfg.critic, model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    metrics = []
    while learner.step():
        metrics.append(dict(learner.state.last_metrics))
    store.close()
    return learner, metrics


def _tensors(learner) -> dict[str, torch.Tensor]:
    """Every tensor the next step depends on: both models' weights and both optimizers' state."""
    out = {f"policy.{k}": v for k, v in learner.policy.state_dict().items()}
    out |= {f"critic.{k}": v for k, v in learner.critic.model.state_dict().items()}
    for name, opt in (("policy_opt", learner.policy_opt.optimizer), ("critic_opt", learner.critic.optimizer.optimizer)):
        for i, state in enumerate(opt.state.values()):
            out |= {f"{name}.{i}.{k}": v for k, v in state.items()}
    return out


def _differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    if a.keys() != b.keys():
        return [f"keys differ: {sorted(a.keys() ^ b.keys())[:5]}"]
    return [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]


def _same_metrics(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_step_is_the_reference_step_bit_for_bit(variant, tmp_path, model_dir, replies):
    overrides = VARIANTS[variant]
    old, old_metrics = _run(ReferenceLearner, tmp_path, "old", model_dir, replies, overrides)
    new, new_metrics = _run(OnlineLearner, tmp_path, "new", model_dir, replies, overrides)
    assert new.state.step == old.state.step >= 3 and new.state.samples == old.state.samples == len(replies)
    assert _differences(_tensors(old), _tensors(new)) == []
    assert len(new_metrics) == len(old_metrics)
    for i, (a, b) in enumerate(zip(old_metrics, new_metrics)):
        assert _same_metrics(a, b), (i, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)})
    counts = ("cut_steps", "jumps", "rejected_steps", "skipped_steps", "updates_since_publish")
    assert [getattr(new.state, k) for k in counts] == [getattr(old.state, k) for k in counts]
    assert (new.learning_rate, new.kl_coef) == (old.learning_rate, old.kl_coef)
    if variant == "steep":  # the trust region did cut back and undo here: those paths are compared too
        assert old.state.cut_steps > 0 and old.state.rejected_steps > 0


def test_the_comparison_sees_one_ulp(tmp_path, model_dir, replies):
    learner, _ = _run(OnlineLearner, tmp_path, "one", model_dir, replies, VARIANTS["default_b1"])
    before = {k: v.clone() for k, v in _tensors(learner).items()}
    assert _differences(before, _tensors(learner)) == []
    with torch.no_grad():
        w = learner.critic.model.score.weight
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(math.inf))
    assert _differences(before, _tensors(learner)) == ["critic.score.weight"]
    assert not _same_metrics({"a": 1.0}, {"a": math.nextafter(1.0, 2.0)})
