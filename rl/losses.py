"""Policy and value losses as pure functions of tensors: no model, config, IO or process calls.

Shapes: `[B, T]` token tensors over a mini-batch of B samples padded to T tokens; `action_mask` is 1 on
tokens the model generated and 0 on padding and environment (observation) tokens. Each loss returns
`(loss, metrics)` with slash-named float metrics.

- `token_mean`: the mean over action tokens every token-level loss uses.
- `clipped_surrogate`: the ONE PPO clip (with optional dual clip) on a ratio-like factor; the learner's
  `ppo_clip_loss` and the diffusion losses (`diffusion/losses.py`) all build on it.
- `sao_policy_loss`: SAO's strict two-sided MASK (not a clip); `staleness_metrics` (per token or sample).
- `ppo_clip_loss`, `value_loss`.
- `kl_penalty` (k3 on the sampled tokens) and `exact_kl_penalty` (the full-vocabulary KL at each
  position): the anchor to a reference policy. k3's gradient in the policy's logprob of a sampled token
  is 1 - exp(ref - lp): when the policy puts MORE mass on it than the reference (the direction of a
  collapse) the pull is at most 1 per token, so a coefficient of 0.1 never pulls harder than 0.1 per
  token, whatever the divergence. The exact KL's gradient grows with the divergence.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """sum(x * mask) / max(1, sum(mask))."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def clipped_surrogate(
    factor: Tensor, advantages: Tensor, clip_eps: float | None = None, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate of `factor` (the ratio, or a factor standing in for it) times A:

        s = min(f A, clip(f, 1 - eps, 1 + eps) A)        (clip_eps None: s = f A)
        s = max(s, c A) where A < 0                      (dual clip c; None: off)

    Returns (s, clipped): `clipped` marks the entries where a clip bound the value (the clipped side was
    the smaller one, or the dual clip's floor was taken). A bound entry has no gradient through f."""
    surrogate = factor * advantages
    clipped = torch.zeros_like(surrogate, dtype=torch.bool)
    if clip_eps is not None:
        alt = torch.clamp(factor, 1 - clip_eps, 1 + clip_eps) * advantages
        clipped = alt < surrogate
        surrogate = torch.minimum(surrogate, alt)
    if dual_clip is not None:
        floor = dual_clip * advantages
        dual = (advantages < 0) & (surrogate < floor)
        clipped = clipped | dual
        surrogate = torch.where(dual, floor, surrogate)
    return surrogate, clipped


def outside_band(ratio: Tensor, eps: float) -> Tensor:
    """Whether |ratio - 1| > eps (PPO's "clip fraction" counts these, whatever the sign of A)."""
    return (ratio.detach() - 1).abs() > eps


def sao_policy_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    eps_low: float,
    eps_high: float,
    staleness: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAO's policy loss: the ratio against the recorded behavior logprobs with a strict two-sided MASK.

    ratio_t = exp(logprobs_t - behavior_logprobs_t)
    keep_t  = action_mask_t and (1 - eps_low < ratio_t < 1 + eps_high)
    loss    = - sum_t keep_t * ratio_t * A_t / max(1, sum_t action_mask_t)

    Tokens outside the band get exactly zero gradient, whatever the sign of A (masked, not clipped).
    Each token's ratio is against the logprob of the version that sampled it, so a response a `keep`
    swap continued under new weights is masked token by token. `staleness` (learner version - sample
    version, per token [B, T] or per sample [B]) is only reported: per token, over action tokens.
    """
    mask = action_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - behavior_logprobs)
    r = ratio.detach()
    low = (r <= 1 - eps_low) & (mask > 0)
    high = (r >= 1 + eps_high) & (mask > 0)
    keep = mask * (~low & ~high).to(mask.dtype)
    n = mask.sum().clamp(min=1)
    loss = -(keep * ratio * advantages.detach()).sum() / n
    metrics = {
        "learner/kept_fraction": float(keep.sum() / n),
        "learner/masked_low_fraction": float(low.sum() / n),
        "learner/masked_high_fraction": float(high.sum() / n),
        "learner/mean_ratio": float(token_mean(r, mask)),
        "learner/policy_loss": float(loss.detach()),
    }
    return loss, metrics | staleness_metrics(staleness, mask)


def staleness_metrics(staleness: Tensor | None, action_mask: Tensor) -> dict[str, float]:
    """Mean and max staleness: per token ([B, T], like `action_mask`) over action tokens only, or per
    sample ([B]) over samples. Empty when there is nothing to report."""
    if staleness is None or not staleness.numel():
        return {}
    values = staleness.float()
    if values.shape == action_mask.shape:
        acted = action_mask > 0
        if not acted.any():
            return {}
        return {"learner/staleness_mean": float(token_mean(values, acted.float())), "learner/staleness_max": float(values[acted].max())}
    return {"learner/staleness_mean": float(values.mean()), "learner/staleness_max": float(values.max())}


def ppo_clip_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, action_mask: Tensor, eps: float = 0.2
) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped surrogate (for the GRPO baseline): - min(ratio * A, clip(ratio, 1-eps, 1+eps) * A),
    token-mean over action tokens. Unlike the SAO mask, a clipped token still passes gradient when the
    unclipped term is the smaller one. `learner/clip_fraction`: action tokens with |ratio - 1| > eps."""
    mask = action_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    surrogate, _ = clipped_surrogate(ratio, advantages.detach(), eps)
    loss = -token_mean(surrogate, mask)
    clip_frac = token_mean(outside_band(ratio, eps).to(mask.dtype), mask)
    return loss, {"learner/clip_fraction": float(clip_frac), "learner/policy_loss": float(loss.detach())}


def value_loss(values: Tensor, returns: Tensor, action_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """0.5 * (V(s_t) - R_t)^2, token-mean over action tokens; R_t are fixed targets (no gradient)."""
    mask = action_mask.to(values.dtype)
    err = values - returns.detach()
    loss = 0.5 * token_mean(err * err, mask)
    target = returns.detach()
    var_r = token_mean((target - token_mean(target, mask)) ** 2, mask)
    var_e = token_mean((err.detach() - token_mean(err.detach(), mask)) ** 2, mask)
    explained = 1 - var_e / var_r if float(var_r) > 0 else torch.tensor(0.0)
    return loss, {"critic/value_loss": float(loss.detach()), "critic/explained_variance": float(explained)}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, action_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Anchor to a reference policy: the k3 estimator of KL(pi || ref) per sampled token,
    exp(ref - lp) - (ref - lp) - 1 (>= 0, unbiased), token-mean over action tokens."""
    mask = action_mask.to(logprobs.dtype)
    d = ref_logprobs.detach() - logprobs
    kl = token_mean(torch.exp(d) - d - 1, mask)
    return kl, {"learner/kl": float(kl.detach())}


def exact_kl_penalty(logp: Tensor, ref_logp: Tensor, action_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Anchor to a reference policy: KL(pi_t || ref_t) = sum_v pi_v (log pi_v - log ref_v) over the whole
    vocabulary at each action position (`logp`, `ref_logp` [B, T, V] log-distributions), token-mean over
    action tokens. Exact (no sampling noise) and its gradient grows with the divergence."""
    kl_t = (logp.exp() * (logp - ref_logp.detach())).sum(-1)
    kl = token_mean(kl_t, action_mask.to(kl_t.dtype))
    return kl, {"learner/kl": float(kl.detach())}
