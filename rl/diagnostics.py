"""What a policy step reveals about stability, as pure functions of tensors: the policy's entropy on the
tokens it was trained on, the KL one update moved it by on those tokens, and how well a value estimate
predicts realised returns across samples.

Shapes: `logp` [B, T, V] log-distributions at the response positions (`rl.batch.response_log_dists`),
`action_mask` [B, T]. Token KLs are exact over the vocabulary (no sampled estimator).
"""

from __future__ import annotations

import torch
from torch import Tensor

from liveloop.rl.losses import token_mean


def token_entropy(logp: Tensor, action_mask: Tensor) -> float:
    """Mean over action tokens of H(pi_t) = - sum_v p_v log p_v (nats)."""
    h = -(logp.exp() * logp).sum(-1)
    return float(token_mean(h, action_mask.to(h.dtype)))


def token_kl(logp_p: Tensor, logp_q: Tensor, action_mask: Tensor) -> float:
    """Mean over action tokens of KL(p_t || q_t) = sum_v p_v (log p_v - log q_v) (nats, >= 0)."""
    kl = (logp_p.exp() * (logp_p - logp_q)).sum(-1)
    return float(token_mean(kl, action_mask.to(kl.dtype)))


def explained_variance(predicted: Tensor, realised: Tensor) -> float:
    """1 - Var(realised - predicted) / Var(realised) across samples (population variances); 0 when the
    realised values do not vary (nothing to explain). 1 is perfect, 0 is no better than their mean,
    negative is worse."""
    realised, predicted = realised.double(), predicted.double()
    var = realised.var(unbiased=False)
    if float(var) == 0.0:
        return 0.0
    return float(1 - (realised - predicted).var(unbiased=False) / var)
