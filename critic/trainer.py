"""The critic's update rule: K value steps per policy step on the same batch, with grad-norm metrics
and a guard that skips a step whose loss or gradient is not finite."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from liveloop.critic.config import CriticConfig
from liveloop.critic.value_model import freeze_attention, token_values
from liveloop.learner.batch import TokenBatch
from liveloop.learner.losses import value_loss


class Critic:
    def __init__(self, model: nn.Module, config: CriticConfig):
        self.model = model
        self.config = config
        self.frozen = freeze_attention(model) if config.freeze_attention else []
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=config.learning_rate, weight_decay=0.0)
        self.skipped_steps = 0

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> Tensor:
        self.model.eval()
        return token_values(self.model, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)

    def update(self, batch: TokenBatch, returns: Tensor) -> dict[str, float]:
        """K optimizer steps fitting V to `returns` [B, W] on action tokens."""
        self.model.train()
        metrics: dict[str, float] = {}
        norms = []
        for _ in range(self.config.value_steps):
            v = token_values(self.model, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)
            loss, metrics = value_loss(v, returns, batch.action_mask)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.config.max_grad_norm)
            if not (torch.isfinite(loss) and torch.isfinite(norm)):
                self.skipped_steps += 1
                self.optimizer.zero_grad(set_to_none=True)
                continue
            self.optimizer.step()
            norms.append(float(norm))
        metrics["critic/grad_norm"] = max(norms) if norms else float("nan")
        metrics["critic/skipped_steps"] = float(self.skipped_steps)
        return metrics
