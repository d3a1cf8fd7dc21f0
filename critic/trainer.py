"""The critic's update rule: K value steps per policy step on the same batch, with grad-norm metrics
and a guard that skips a step whose loss or gradient is not finite.

The learner needs the critic's values on a batch (for GAE) and then K value steps on that batch. The
values and the first value step share ONE forward (`values_for_update`, then `update(..., first=...)`):
both are the critic at the same weights on the same batch, so without dropout the values are that
forward's output detached, the same bits as a separate no-grad forward. A value model with dropout
(`value_model.has_dropout`) keeps the separate eval-mode forward (train mode would drop units). Each later
value step needs its own forward: it runs at the weights the step before it left, so nothing of an earlier
forward can stand in for it. The K steps stay K optimizer steps."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from liveloop.critic.config import CriticConfig
from liveloop.critic.value_model import freeze_attention, has_dropout, token_values
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
        self.dropout = has_dropout(model)  # train and eval forwards differ: no forward shared (module docstring)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> Tensor:
        self.model.eval()
        return token_values(self.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)

    def values_for_update(self, batch: TokenBatch) -> tuple[Tensor, Tensor | None]:
        """(V on `batch` [B, W] without a graph, the first value step's forward with its graph or None): hand
        the second to `update` as `first`, before the weights change. None when the model has dropout: then
        the values come from their own eval-mode forward, as `values`."""
        if self.dropout:
            return self.values(batch), None
        self.model.train()
        first = token_values(self.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width)
        return first.detach(), first

    def update(self, batch: TokenBatch, returns: Tensor, first: Tensor | None = None) -> dict[str, float]:
        """K optimizer steps fitting V to `returns` [B, W] on action tokens; `first`: the first step's forward
        (`values_for_update` on this batch at the current weights), else the first step makes its own."""
        self.model.train()
        metrics: dict[str, float] = {}
        norms = []
        for k in range(self.config.value_steps):
            v = first if k == 0 and first is not None else token_values(
                self.optimizer.module, batch.input_ids, batch.attention_mask, batch.prompt_lengths, batch.width
            )
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
