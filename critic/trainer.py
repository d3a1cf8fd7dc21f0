"""The critic's update rule: K value steps per policy step on the same batch, with grad-norm metrics
and a guard that skips a step whose loss or gradient is not finite."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from liveloop.critic.config import CriticConfig
from liveloop.critic.value_model import freeze_attention, token_values
from liveloop.rl.batch import TokenBatch
from liveloop.rl.losses import value_loss
from liveloop.rl.optim import make_optimizer


class Critic:
    def __init__(self, model: nn.Module, config: CriticConfig, zero_stage: int = 0, micro_batch: int = 1, master_weights: bool = True):
        self.model = model
        self.config = config
        self.frozen = freeze_attention(model) if config.freeze_attention else []
        self.optimizer = make_optimizer(model, config.learning_rate, config.max_grad_norm, zero_stage, micro_batch, master_weights)
        self.trainable = self.optimizer.params
        self.skipped_steps = 0

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> Tensor:
        self.model.eval()
        return token_values(self.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)

    def update(self, batch: TokenBatch, returns: Tensor) -> dict[str, float]:
        """K optimizer steps fitting V to `returns` [B, W] on action tokens."""
        self.model.train()
        metrics: dict[str, float] = {}
        norms = []
        for _ in range(self.config.value_steps):
            v = token_values(self.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)
            loss, metrics = value_loss(v.float(), returns, batch.action_mask)
            norm = self.optimizer.step(loss)
            if norm is None:
                self.skipped_steps += 1
            else:
                norms.append(norm)
        metrics["critic/grad_norm"] = max(norms) if norms else float("nan")
        metrics["critic/skipped_steps"] = float(self.skipped_steps)
        return metrics

    def save(self, directory: str) -> None:
        with self.optimizer.full_parameters() as model:
            model.save_pretrained(directory)
