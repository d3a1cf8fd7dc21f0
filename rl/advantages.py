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
- `RunningMean`: the mean of the last ~horizon values (the plain mean while there are at most `horizon`
  of them, then an exponential moving average with weight 1 / horizon); immutable, `add` returns the next.
- `running_mean_baselines`: each sample's baseline is the running mean of the rewards BEFORE it (none yet:
  0), the state then takes its reward; `constant_baseline_gae` is GAE with that baseline as every token's
  value (at gamma = lambda = 1: r - baseline on every action token).
- `normalize_by_running_rms`: each sample's advantages divided by the running RMS of action-token
  advantages, the state first taking that sample's mean square (so the first sample uses its own scale),
  the scale floored so a stretch of near-zero advantages cannot blow them up.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class RunningMean:
    """The mean of the last ~horizon values: the plain mean while `count` <= horizon, then an EMA with
    weight 1 / horizon. `add` returns the next state (this one is unchanged)."""

    value: float = 0.0
    count: int = 0

    def add(self, x: float, horizon: int) -> "RunningMean":
        n = self.count + 1
        weight = max(1.0 / n, 1.0 / horizon)
        return RunningMean(self.value + weight * (x - self.value), n)


def running_mean_baselines(rewards: list[float], state: RunningMean, horizon: int) -> tuple[list[float], RunningMean]:
    """Per sample in order: its baseline (the running mean of the rewards before it; 0 before any), then
    the state takes its reward. Returns (baselines, the state after the last)."""
    baselines = []
    for r in rewards:
        baselines.append(state.value if state.count else 0.0)
        state = state.add(float(r), horizon)
    return baselines, state


def constant_baseline_gae(
    baseline: float, reward: float, action_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> Tensor:
    """GAE over action tokens (`gae_skip_observations`) with `baseline` as every token's value. One
    sample, action_mask [T]; returns advantages [T] (0 on observation tokens)."""
    values = torch.full(action_mask.shape, float(baseline))
    advantages, _ = gae_skip_observations(values, reward, action_mask, gamma, lam)
    return advantages


def normalize_by_running_rms(
    advantages: Tensor, action_mask: Tensor, state: RunningMean, horizon: int, floor: float
) -> tuple[Tensor, list[float], RunningMean]:
    """advantages, action_mask [B, W]. Per sample in order: the state (a running mean of per-sample mean
    squared action-token advantages) takes this sample's, and its advantages are divided by
    scale = max(sqrt(state), floor). A sample without action tokens is left as it is (scale 1, state
    unchanged). Returns (normalised advantages [B, W], the scales, the state after the last)."""
    out = advantages.clone()
    scales = []
    for b in range(advantages.shape[0]):
        mask = action_mask[b] > 0
        if not bool(mask.any()):
            scales.append(1.0)
            continue
        state = state.add(float(advantages[b][mask].double().pow(2).mean()), horizon)
        scale = max(state.value ** 0.5, floor)
        out[b] = advantages[b] / scale
        scales.append(scale)
    return out, scales, state
