"""The learner's stability signals over a window of recent samples: how well the critic predicts the
realised return (its value at a response's first action token against the rating it got), the balance of
advantage signs, and reply lengths.

At batch size 1 with gamma = lambda_value = 1 every token's value target in one step is the same reward,
so the critic's per-step explained variance (`critic/explained_variance`) is 0 by construction; across a
window of samples it is a real measure:
    critic/value_error           mean |V(first action token) - r| over the window (predicted BEFORE the update)
    critic/explained_variance_window   1 - Var(r - V) / Var(r) over the window
    learner/advantage_positive_fraction   share of action tokens with A > 0 over the window
    learner/response_length      mean action tokens per sample over the window
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from liveloop.rl.batch import TokenBatch
from liveloop.rl.diagnostics import explained_variance


class StabilityWindow:
    def __init__(self, size: int):
        self.values: deque[float] = deque(maxlen=size)
        self.rewards: deque[float] = deque(maxlen=size)
        self.positive: deque[tuple[int, int]] = deque(maxlen=size)
        self.lengths: deque[int] = deque(maxlen=size)

    def add(self, batch: TokenBatch, values: Tensor | None, advantages: Tensor) -> dict[str, float]:
        """Record one step's samples; returns the window's metrics."""
        mask = batch.action_mask > 0
        for b in range(mask.shape[0]):
            tokens = int(mask[b].sum())
            self.lengths.append(tokens)
            self.positive.append((int((advantages[b][mask[b]] > 0).sum()), tokens))
            if values is not None and tokens:
                first = int(torch.nonzero(mask[b])[0, 0])
                self.values.append(float(values[b, first]))
                self.rewards.append(float(batch.rewards[b]))
        positive, total = (sum(x) for x in zip(*self.positive))
        metrics = {
            "learner/advantage_positive_fraction": positive / max(1, total),
            "learner/response_length": sum(self.lengths) / len(self.lengths),
        }
        if self.values:
            v, r = torch.tensor(list(self.values)), torch.tensor(list(self.rewards))
            metrics["critic/value_error"] = float((v - r).abs().mean())
            metrics["critic/explained_variance_window"] = explained_variance(v, r)
        return metrics
