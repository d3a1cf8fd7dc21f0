"""Advantage estimators as pure functions of tensors.

- `gae_skip_observations`: SAO's token-level GAE over action tokens only: an observation token
  (action_mask 0) is skipped, so next(a_i) = a_{i+1}; V(next(a_n)) = 0; the reward sits on the last
  action token. Observation tokens get advantage 0.
- `length_adaptive_lambda`: VAPO's lambda_policy = 1 - 1 / (alpha * L).
- `sliding_window_advantage`: the no-critic baseline, A = r - mean(last W rewards).
- `group_normalized_advantages`: GRPO's group normalisation, the ONE convention every group method uses
  (the learner's GRPO baselines and BGPO and its diffusion baselines):
      groups are the rows of `rewards` [M, G] (G responses to the same prompt per row);
      A = (r - mean_G r) / std_G r with the unbiased (sample, G - 1) std, as in GRPO, TRL and d1;
      a group whose std is <= eps (all rewards equal) or of size G = 1 gets A = 0 (no signal);
      eps only decides "all equal": it is never added to the std.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae_skip_observations(
    values: Tensor, reward: float | Tensor, action_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """One sample. values, action_mask: [T]. Returns (advantages [T], returns [T]) with zeros on
    observation tokens; returns = advantages + values on action tokens (the value targets)."""
    values = values.detach()
    positions = torch.nonzero(action_mask > 0, as_tuple=False).flatten().tolist()
    adv = torch.zeros_like(values)
    running = 0.0
    next_value = 0.0
    for k in range(len(positions) - 1, -1, -1):
        t = positions[k]
        r = float(reward) if k == len(positions) - 1 else 0.0
        delta = r + gamma * next_value - float(values[t])
        running = delta + gamma * lam * running
        adv[t] = running
        next_value = float(values[t])
    returns = torch.where(action_mask > 0, adv + values, torch.zeros_like(values))
    return adv, returns


def length_adaptive_lambda(num_action_tokens: int, alpha: float = 0.05) -> float:
    """lambda_policy = 1 - 1 / (alpha * L), floored at 0 for very short responses."""
    if num_action_tokens <= 0:
        return 0.0
    return max(0.0, 1.0 - 1.0 / (alpha * num_action_tokens))


def sliding_window_advantage(reward: float, history: Tensor) -> tuple[float, dict[str, float]]:
    """A = r - mean(history); `history` holds the last W rewards (before this one). Empty -> baseline 0."""
    baseline = float(history.float().mean()) if history.numel() else 0.0
    return reward - baseline, {"learner/baseline": baseline}


def group_normalized_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """A = (r - mean_G r) / std_G r per row of `rewards` [M, G], unbiased std; a row whose std is
    <= eps (all rewards equal) or of size G = 1 gets A = 0. Returns [M, G] (float)."""
    r = rewards.float()
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True) if r.shape[1] > 1 else torch.zeros_like(mean)
    return torch.where(std > eps, (r - mean) / std.clamp(min=eps), torch.zeros_like(r))
