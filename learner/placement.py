"""Where the learner's models live and in which dtype (`[learner] device`, `dtype`): the policy, the
critic and the KL reference all follow one `Placement`, and a batch read from the store (CPU tensors)
moves there in one call.

    place = placement(config)            # auto: cuda + bfloat16 when a GPU is there, else cpu + float32
    model = place.load_causal_lm(path)   # from_pretrained in place.dtype, moved to place.device
    batch = place.batch(batch)           # every tensor field of a TokenBatch on place.device
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from liveloop.learner.config import LearnerConfig

T = TypeVar("T")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DeviceUnavailable(RuntimeError):
    """`[learner] device = "cuda"` on a machine where torch sees no CUDA device."""


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    gradient_checkpointing: bool = False

    def load_causal_lm(self, path: str | Path, trainable: bool = True) -> nn.Module:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=self.dtype).to(self.device)
        if trainable:
            self.prepare(model)
        return model

    def prepare(self, model: nn.Module) -> nn.Module:
        """Gradient checkpointing on a model that trains, when configured (no KV cache then)."""
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        return model

    def batch(self, batch: T) -> T:
        """A dataclass batch with each tensor field on this device (the rest as it is)."""
        if self.device.type == "cpu":
            return batch
        moved: dict[str, Any] = {}
        for f in fields(batch):  # type: ignore[arg-type]
            value = getattr(batch, f.name)
            if isinstance(value, torch.Tensor):
                moved[f.name] = value.to(self.device, non_blocking=True)
        return replace(batch, **moved)  # type: ignore[type-var]


def placement(config: LearnerConfig) -> Placement:
    """The device and dtype `config` asks for, resolved on this machine."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("[learner] device = 'cuda', but torch sees no CUDA device here")
    device = torch.device("cuda" if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else "cpu")
    dtype = _DTYPES[config.dtype] if config.dtype != "auto" else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return Placement(device, dtype, config.gradient_checkpointing)
