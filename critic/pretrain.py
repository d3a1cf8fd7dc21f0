"""Critic cold start: fit the value model to Monte-Carlo returns (the sample's reward on every action
token; gamma = lambda = 1) on rollouts of the initial policy or on rated responses already in the
store, epoch after epoch, until the explained variance passes a threshold. Too little pre-training
wrecks early RL (SAO), so this is a first-class step with its own progress bar."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from tqdm import tqdm

from liveloop.critic.trainer import Critic
from liveloop.learner.batch import Sample, make_batch


def monte_carlo_returns(batch) -> torch.Tensor:
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


def pretrain_critic(
    critic: Critic,
    samples: Sequence[Sample],
    ev_threshold: float = 0.5,
    max_epochs: int = 20,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, float]:
    if not samples:
        raise ValueError("critic pre-training needs at least one rated sample")
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
