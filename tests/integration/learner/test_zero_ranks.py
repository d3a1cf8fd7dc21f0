"""The policy step across 2 ranks (learner/ranks.py), for real: two processes in one gloo group under
DeepSpeed ZeRO-2 and ZeRO-3, each stepping on its share of the batch, against the one-rank step on the
whole batch; the online learner stepping and publishing with `ranks = 2`; and the group listening on
loopback only.

A process becomes rank 0 of one group for its life (torch.distributed has one default group), so the
2-rank runs happen in one spawned process of their own (zero_ranks_rank0.py, rank 0, which spawns
rank 1), all in turn in one group; the one-rank references run in the test process, as
tests/integration/learner/test_zero.py does. DeepSpeed's communication op is the one that test
compiles and caches ($TORCH_EXTENSIONS_DIR).

Tolerance: the 2-rank gradient is the same sum as the 1-rank one in another grouping (two shares'
gradients averaged; ZeRO-3 also reorders each tensor's sums), ~1e-8 apart, and Adam's first step
(~lr * g / (|g| + eps)) magnifies that on elements whose gradient is near eps (up to 4e-5 = 0.04 lr
measured on ZeRO-2 here). So the whole update is compared: it must agree to 1e-3 relative."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.methods import make_method
from liveloop.learner.objective import policy_objective
from liveloop.learner.online import OnlineLearner
from liveloop.rl.batch import Sample, TokenBatch, make_batch, response_logprobs
from liveloop.rl.optim import make_optimizer
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

pytestmark = pytest.mark.slow

RANK0 = Path(__file__).with_name("zero_ranks_rank0.py")
CONFIG = {"batch_size": 4, "learning_rate": 1e-3, "device": "cpu"}  # [learner] of every run here, plus stage and ranks
LEARNER = {"zero_stage": 3, "publish_every_steps": 1, "max_per_key_per_batch": 4}
MAX_REL = 1e-3
SHAPES = [(6, 10), (4, 3), (7, 8), (5, 12)]  # (prompt, response) tokens: the shares hold unequal token counts


def _own_logprobs(model_dir: Path, samples: list[Sample]) -> list[np.ndarray]:
    """Each response's token logprobs under the model, 0.1 lower (ratios ~1.105: every token kept)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    batch = make_batch(samples)
    with torch.no_grad():
        own = response_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch)
    return [own[b, : len(s.response_ids)].numpy() - 0.1 for b, s in enumerate(samples)]


def _samples(model_dir: Path, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    raw = [
        Sample(rng.integers(5, 500, p), rng.integers(5, 500, r), np.zeros(r, np.float32), np.ones(r, np.uint8), float(i % 2), 0)
        for i, (p, r) in enumerate(SHAPES)
    ]
    return [
        Sample(s.prompt_ids, s.response_ids, lp, s.action_mask, s.reward, 0) for s, lp in zip(raw, _own_logprobs(model_dir, raw))
    ]


def _batch(model_dir: Path) -> tuple[TokenBatch, torch.Tensor]:
    batch = make_batch(_samples(model_dir, 0))
    advantages = torch.linspace(-1, 1, batch.width).expand_as(batch.action_mask) * batch.action_mask
    return batch, advantages


def _rated_store(path: Path, model_dir: Path) -> Store:
    """4 rated responses (behaviour logprobs near the model's own) in a fresh SQLite store."""
    store = Store(StoreConfig(url=f"sqlite:///{path}"))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    for i, s in enumerate(_samples(model_dir, 1)):
        rec = ResponseRecord(
            f"r{i}", f"k{i}", "m", 0, "chat", tuple(int(x) for x in s.prompt_ids), tuple(int(x) for x in s.response_ids),
            tuple(float(x) for x in s.behavior_logprobs), "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", f"k{i}", i % 2))
    return store


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_dir):
    """The 2-rank runs, in one rank-0 process: ZeRO-2 step, ZeRO-3 step, the learner (ZeRO-3)."""
    tmp = tmp_path_factory.mktemp("ranks")
    torch.save(_batch(model_dir), tmp / "inputs.pt")
    _rated_store(tmp / "learn.db", model_dir).close()
    step = {"mode": "step", "model_dir": str(model_dir), "inputs": str(tmp / "inputs.pt")}
    runs = [step | {"config": CONFIG | {"zero_stage": stage, "ranks": 2}} for stage in (2, 3)]
    runs.append({"mode": "learn", "model_dir": str(model_dir), "db": str(tmp / "learn.db"),
                 "config": CONFIG | LEARNER | {"ranks": 2, "checkpoint_dir": str(tmp / "versions")}})
    runs.append({"mode": "listening", "config": CONFIG | {"zero_stage": 3, "ranks": 2}})
    (tmp / "runs.json").write_text(json.dumps(runs))
    try:  # a bound, not a speed check: the first run on a machine may compile DeepSpeed's op (minutes)
        done = subprocess.run([sys.executable, str(RANK0), str(tmp / "runs.json"), str(tmp / "out.pt")],
                              capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the 2-rank runs did not finish in 900 s: {e.stderr}")
    assert done.returncode == 0, f"the 2-rank runs failed:\n{done.stderr[-4000:]}"
    zero2, zero3, learned, listening = torch.load(tmp / "out.pt", weights_only=False)
    store = Store(StoreConfig(url=f"sqlite:///{tmp / 'learn.db'}"))
    (version,) = store.versions.versions_with_status("published")
    store.close()
    return {2: zero2, 3: zero3, "learn": learned, "published": version, "listening": listening["listening"]}


def _start(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()


def _relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||a - start|| over all tensors: how far b's update is from a's, relative to a's."""
    update = sum(float((a[k] - start[k]).pow(2).sum()) for k in a) ** 0.5
    assert update > 0, "the step did not move the weights"
    return sum(float((a[k] - b[k]).pow(2).sum()) for k in a) ** 0.5 / update


def _one_rank(model_dir: Path, stage: int) -> dict[str, torch.Tensor]:
    """The one-rank learner's step (online.py `_objective` + `step`) on the whole batch."""
    from transformers import AutoModelForCausalLM

    config = LearnerConfig(**CONFIG, zero_stage=stage)
    batch, advantages = _batch(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = make_optimizer(model, config.learning_rate, config.max_grad_norm, stage, config.batch_size)
    staleness = torch.zeros_like(batch.versions)
    loss, _, _ = policy_objective(opt.module, make_method(config), config.kl_estimator, 0.0, batch, advantages, staleness, None)
    assert opt.step(loss) is not None
    with opt.full_parameters() as full:
        return {k: v.detach().clone() for k, v in full.state_dict().items()}


@pytest.mark.parametrize("stage", [2, 3])
def test_two_rank_step_equals_one_rank_step(two_ranks, model_dir, stage):
    two, start = two_ranks[stage], _start(model_dir)
    first, second = two["gathered"]
    # complete: every tensor of the model at its full shape (ZeRO-3 keeps only a partition per rank)
    assert first.keys() == start.keys() and all(first[k].shape == start[k].shape for k in start)
    assert all(torch.equal(first[k], second[k]) for k in first)  # a second gather reads the same weights
    assert two["norm"] is not None and two["metrics"]["learner/kept_fraction"] == pytest.approx(1.0)
    assert two["metrics"]["learner/step_kl"] > 0
    one = _one_rank(model_dir, stage)
    error = _relative(one, first, start)
    worst = max(float((one[k] - first[k]).abs().max()) for k in one)
    assert error < MAX_REL, f"2-rank ZeRO-{stage} update differs from 1-rank by {error:.2e} (relative; worst element {worst:.1e})"


def test_online_learner_steps_and_publishes_across_two_ranks(two_ranks, tmp_path, model_dir):
    """One real SAO step (critic on rank 0, advantages, the policy on 2 ranks under ZeRO-3) on 4 rated
    responses, published: complete weights equal to the one-rank learner's on the same ratings."""
    from transformers import AutoModelForCausalLM

    learned, version = two_ranks["learn"], two_ranks["published"]
    assert learned["skipped_steps"] == 0 and learned["samples"] == 4 and version.samples_used == 4
    assert learned["metrics"]["learner/kept_fraction"] == pytest.approx(1.0)
    two = AutoModelForCausalLM.from_pretrained(version.checkpoint_path).state_dict()
    store = _rated_store(tmp_path / "one.db", model_dir)
    config = LearnerConfig(**CONFIG, **LEARNER, ranks=1, checkpoint_dir=str(tmp_path / "versions"))
    learner = OnlineLearner.resume(
        config, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=1)
    (mine,) = store.versions.versions_with_status("published")
    one = AutoModelForCausalLM.from_pretrained(mine.checkpoint_path).state_dict()
    store.close()
    start = AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()
    assert two.keys() == start.keys() and all(two[k].shape == start[k].shape for k in start)
    error = _relative(one, two, start)
    assert error < MAX_REL, f"the 2-rank learner's published update differs from 1-rank's by {error:.2e} (relative)"
    for key in ("learner/entropy", "learner/kept_fraction", "learner/mean_ratio"):  # reduced over the ranks
        assert learned["metrics"][key] == pytest.approx(learner.state.last_metrics[key], rel=1e-4)


def test_the_group_listens_on_loopback_only(two_ranks):
    """No rendezvous server on every interface (torch's TCP store would be one): another host cannot
    join the group or feed its collectives."""
    assert all(ip.startswith("127.") or ip == "::1" for ip in two_ranks["listening"]), two_ranks["listening"]


def test_ranks_config_is_validated():
    for bad in (
        dict(ranks=2),  # zero_stage 0
        dict(ranks=2, zero_stage=2, batch_size=1),  # a rating per rank
        dict(ranks=2, zero_stage=2, batch_size=2, device="cuda"),
        dict(ranks=0),
    ):
        with pytest.raises(ValueError, match="ranks"):
            LearnerConfig(**bad)
    assert LearnerConfig(ranks=2, zero_stage=3, batch_size=2).ranks == 2
