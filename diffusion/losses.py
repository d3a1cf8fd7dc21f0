"""Policy losses for masked diffusion LMs as pure functions of tensors: BGPO, VRPO-OL and diffu-GRPO. No
model, config, IO or process calls; each returns `(loss, metrics)`. Their group advantages and PPO clip
come from the RL core (`rl/advantages.group_normalized_advantages`, `rl/losses.clipped_surrogate`); the
job picks one of them by name through `objectives.py`.

Shapes: N responses (all groups of a batch together), n_t Monte-Carlo ELBO samples, L response tokens.
`l_theta`, `l_old` are per-sample ELBO terms l_j (see `elbo.py`); `l_old` never gets gradient.

BGPO (arXiv 2510.11683) replaces exp(B_theta - B_old) * A, which is not linear in the samples, by a lower
bound that is a SUM over samples, with d_j = l_theta^(j) - l_old^(j):
    A >= 0: g_j = (1 + d_j) * A / n_t      (tangent: e^d >= 1 + d)
    A <  0: g_j = exp(d_j) * A / n_t       (Jensen: exp(mean d) <= mean exp(d))
    loss = - (1 / N) * sum_i sum_j g_j(i)
Each g_j depends on one masked sample, so it is back-propagated alone (`bgpo_sample_loss`) and gradients
accumulate: memory does not grow with n_t. On-policy (d = 0) value and gradient equal VRPO-OL's.
Optional PPO clip (eps) and dual-clip (c) treat the bound's factor f_j = (1 + d_j) or exp(d_j) as the
ratio: min(f A, clip(f, 1 - eps, 1 + eps) A), and for A < 0 max(that, c A), as the reference code does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from liveloop.rl.losses import clipped_surrogate, outside_band


def bgpo_sample_loss(
    l_theta: Tensor,
    l_old: Tensor,
    advantages: Tensor,
    n_t: int,
    num_responses: int | None = None,
    clip_eps: float | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The BGPO loss of ONE Monte-Carlo sample j: - sum_i g_j(i) / N. l_theta, l_old, advantages: [N'] for
    the N' responses in this call (a group or a slice); `num_responses` N normalizes over the whole batch
    (default N'). Summing this over j (and slices) gives `bgpo_loss`."""
    n = num_responses if num_responses is not None else l_theta.shape[0]
    adv = advantages.detach()
    d = l_theta - l_old.detach()
    positive = adv >= 0
    # exp only where A < 0: an overflowing exp on the other branch would turn its zero gradient into NaN
    factor = torch.where(positive, 1 + d, torch.exp(torch.where(positive, torch.zeros_like(d), d)))
    surrogate, clipped = clipped_surrogate(factor, adv, clip_eps, dual_clip)
    loss = -(surrogate / n_t).sum() / n
    metrics = {
        "bgpo/loss": float(loss.detach()),
        "bgpo/mean_d": float(d.detach().mean()),
        "bgpo/clip_fraction": float(clipped.float().mean()),
    }
    return loss, metrics


def bgpo_loss(
    l_theta: Tensor, l_old: Tensor, advantages: Tensor, clip_eps: float | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The whole bound over [N, n_t] terms in one graph (reference for tests and small n_t)."""
    n, n_t = l_theta.shape
    total = l_theta.new_zeros(())
    for j in range(n_t):
        loss_j, _ = bgpo_sample_loss(l_theta[:, j], l_old[:, j], advantages, n_t, n, clip_eps, dual_clip)
        total = total + loss_j
    d = (l_theta - l_old).detach()
    return total, {"bgpo/loss": float(total.detach()), "bgpo/mean_d": float(d.mean())}


def vrpo_ol_loss(
    l_theta: Tensor, l_old: Tensor, advantages: Tensor, clip_eps: float | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """VRPO-OL: - mean_i exp(B_theta - B_old) * A_i with B = mean_j l_j [N, n_t]: every sample's graph is
    held until backward (memory grows with n_t). Same optional clip / dual-clip on the ratio."""
    d = (l_theta - l_old.detach()).mean(dim=1)
    ratio = torch.exp(d)
    surrogate, clipped = clipped_surrogate(ratio, advantages.detach(), clip_eps, dual_clip)
    loss = -surrogate.mean()
    return loss, {"vrpo/loss": float(loss.detach()), "vrpo/mean_ratio": float(ratio.detach().mean()),
                  "vrpo/clip_fraction": float(clipped.float().mean())}


def diffu_grpo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor | None = None,
    clip_eps: float = 0.2,
) -> tuple[Tensor, dict[str, float]]:
    """diffu-GRPO (d1): PPO's clipped surrogate on per-token one-pass estimates [N, L]: per token
    - min(ratio A, clip(ratio, 1 - eps, 1 + eps) A), mean over the response's tokens, then over N."""
    mask = torch.ones_like(logprobs) if response_mask is None else response_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    surrogate, _ = clipped_surrogate(ratio, advantages.detach()[:, None], clip_eps)
    per_token = -surrogate
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    loss = per_seq.mean()
    clip_frac = (outside_band(ratio, clip_eps).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"diffu_grpo/loss": float(loss.detach()), "diffu_grpo/clip_fraction": float(clip_frac)}
