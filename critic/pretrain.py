"""Critic cold start: fit the value model to Monte-Carlo returns (the sample's reward on every action
token; gamma = lambda = 1) on rollouts of the initial policy or on rated responses already in the
store, epoch after epoch, until the explained variance passes a threshold. Too little pre-training
wrecks early RL (SAO), so this is a first-class step with its own progress bar.

`pretrain` is the one entry point: it collects the rollouts a `RolloutPlan` describes (or takes rated
samples), fits a fresh critic on the policy's backbone and saves it. Its callers differ only in what
they pass: `liveloop critic pretrain` (learner/critic_start.py: the wiring's prompts and reward, the
`[critic]` counts, the version the learner resumes from) and the drift experiments
(experiments/drift.py: the scenario's prompts rated by its judge).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from liveloop.checkpoint import save_atomically
from liveloop.critic.config import CriticConfig
from liveloop.critic.trainer import Critic
from liveloop.critic.value_model import build_value_model
from liveloop.rl.batch import Sample, TokenBatch, make_batch
from liveloop.rl.rollout import chat_prompt_ids, sample_reply


@dataclass(frozen=True)
class RolloutPlan:
    """Rollouts of a policy to pre-train on: `count` replies of at most `max_tokens` tokens, the i-th to
    `prompt(i, rng)` and rated `reward(i, prompt, reply_text)`. `seed` seeds both the prompts' rng and
    the sampling generator."""

    prompt: Callable[[int, random.Random], str]
    reward: Callable[[int, str, str], float]
    count: int
    max_tokens: int
    seed: int = 0
    temperature: float = 1.0


def collect_rollouts(policy_dir: str | Path, plan: RolloutPlan, progress: bool = True) -> list[Sample]:
    """Sample the plan's replies from the policy in `policy_dir` and rate each (every token an action)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(policy_dir))
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype=torch.float32)
    rng = random.Random(plan.seed)
    gen = torch.Generator().manual_seed(plan.seed)
    samples = []
    for i in tqdm(range(plan.count), desc="rollouts", disable=not progress):
        prompt = plan.prompt(i, rng)
        r = sample_reply(model, tok, chat_prompt_ids(tok, prompt), plan.max_tokens, gen, plan.temperature)
        samples.append(Sample.from_rollout(r, float(plan.reward(i, prompt, r.text))))
    return samples


def monte_carlo_returns(batch: TokenBatch) -> torch.Tensor:
    return batch.rewards[:, None] * batch.action_mask


def explained_variance(critic: Critic, samples: Sequence[Sample], batch_size: int) -> float:
    values, targets = [], []
    for i in range(0, len(samples), batch_size):
        batch = make_batch(samples[i : i + batch_size])
        v = critic.values(batch)
        mask = batch.action_mask > 0
        values.append(v[mask])
        targets.append(monte_carlo_returns(batch)[mask])
    v, r = torch.cat(values), torch.cat(targets)
    var_r = r.var(unbiased=False)
    return float(1 - (r - v).var(unbiased=False) / var_r) if var_r > 0 else 0.0


def _require_samples(samples: Sequence[Sample]) -> None:
    if not samples:
        raise ValueError("critic pre-training needs at least one rated sample")


def pretrain_critic(
    critic: Critic,
    samples: Sequence[Sample],
    ev_threshold: float = 0.5,
    max_epochs: int = 20,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float]:
    """Fit `critic` in place: epochs over the shuffled samples until the explained variance passes
    `ev_threshold` or `max_epochs` epochs are done."""
    _require_samples(samples)
    rng = random.Random(seed)
    order = list(samples)
    ev = explained_variance(critic, order, batch_size)
    epochs = 0
    with tqdm(total=max_epochs, desc="critic pretrain", unit="epoch", disable=not progress) as bar:
        bar.set_postfix(ev=f"{ev:.3f}")
        while ev < ev_threshold and epochs < max_epochs:
            rng.shuffle(order)
            for i in range(0, len(order), batch_size):
                batch = make_batch(order[i : i + batch_size])
                critic.update(batch, monte_carlo_returns(batch))
            epochs += 1
            ev = explained_variance(critic, order, batch_size)
            bar.update(1)
            bar.set_postfix(ev=f"{ev:.3f}")
    return {"critic/explained_variance": ev, "critic/pretrain_epochs": float(epochs), "critic/pretrain_samples": float(len(samples))}


def pretrain(
    policy_dir: str | Path,
    config: CriticConfig,
    out_dir: str | Path,
    data: RolloutPlan | Sequence[Sample],
    ev_threshold: float,
    max_epochs: int,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float]:
    """The critic's cold start: rollouts of the policy in `policy_dir` as `data` plans them (or the
    rated samples `data` holds), a fresh critic on that policy's backbone (value head initialised under
    torch seed `seed`) fitted by `pretrain_critic`, saved atomically to `out_dir`. Returns the fit's
    metrics and `critic/pretrain_reward_rate` (the samples' mean reward)."""
    samples = collect_rollouts(policy_dir, data, progress) if isinstance(data, RolloutPlan) else list(data)
    _require_samples(samples)
    torch.manual_seed(seed)
    critic = Critic(build_value_model(policy_dir, lora_rank=config.lora_rank), config)
    result = pretrain_critic(critic, samples, ev_threshold, max_epochs, progress=progress)
    save_atomically(Path(out_dir), lambda tmp: critic.save(str(tmp)))
    return result | {"critic/pretrain_reward_rate": sum(s.reward for s in samples) / len(samples)}
