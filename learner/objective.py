"""What the policy step descends, as one function of the model and the batch: the method's policy loss
plus the KL anchor. The one-process learner (online.py) and every rank of a multi-rank step
(ranks.py) compute it with this same code, the latter each on its share of the batch."""

from __future__ import annotations

from typing import Any

import torch

from liveloop.rl.batch import TokenBatch, policy_log_dists, token_logprobs
from liveloop.rl.losses import exact_kl_penalty, kl_penalty


def policy_objective(
    module: Any, method: Any, kl_estimator: str, kl_coef: float,
    batch: TokenBatch, advantages: torch.Tensor, staleness: torch.Tensor, ref: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The method's policy loss at `module`'s weights plus `kl_coef` times the KL anchor to `ref` (the
    base's log-distributions; None: no anchor). Returns (loss, response log-dists, metrics)."""
    dists = policy_log_dists(module, batch)
    logprobs = token_logprobs(dists, batch)
    loss, metrics = method.policy_loss(logprobs, batch, advantages, staleness)
    if ref is not None:
        if kl_estimator == "exact":
            kl, kl_metrics = exact_kl_penalty(dists, ref, batch.action_mask)
        else:
            kl, kl_metrics = kl_penalty(logprobs, token_logprobs(ref, batch), batch.action_mask)
        loss = loss + kl_coef * kl
        metrics |= kl_metrics
    return loss, dists, metrics
