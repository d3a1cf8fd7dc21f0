"""Optimizer steps behind one small interface: plain torch AdamW (the default on one machine) or
DeepSpeed ZeRO stage 1-3 (for models that do not fit one device), for the policy and the critic alike.

    opt = make_optimizer(model, lr, max_grad_norm, zero_stage)
    out = opt.module(input_ids=...)        # forward through it (ZeRO-3 gathers parameters on the fly)
    norm = opt.step(loss)                  # backward, clip, step; None and no update if not finite
    opt.set_lr(lr)                         # the next steps' learning rate (step-size control)
    with opt.full_parameters(): ...        # full weights, for checks and save_pretrained

ZeRO runs in one process on CPU too (gloo), which is how it is tested here; its C++ communication op
compiles once on first use into $TORCH_EXTENSIONS_DIR (about 2 minutes on this machine).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn


class TorchOptimizer:
    def __init__(self, model: nn.Module, lr: float, max_grad_norm: float):
        self.module = model
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.max_grad_norm = max_grad_norm

    def step(self, loss: Tensor) -> float | None:
        self.optimizer.zero_grad(set_to_none=True)
        if not torch.isfinite(loss):
            return None
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        return float(norm)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        yield self.model


def _single_process_env() -> None:
    # One process, no MPI: DeepSpeed reads the torch.distributed variables.
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/liveloop/torch_extensions"))


class ZeroOptimizer:
    def __init__(self, model: nn.Module, lr: float, max_grad_norm: float, stage: int, micro_batch: int = 1):
        _single_process_env()
        import deepspeed

        self.model = model
        self.stage = stage
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        config = {
            "train_batch_size": micro_batch,
            "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage},
            "fp16": {"enabled": False},
            "bf16": {"enabled": False},
            "gradient_clipping": max_grad_norm,
            "steps_per_print": 10**9,
        }
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=params, config=config)
        self.module = self.engine
        self.params = params

    def _grad_norm(self) -> float:
        from deepspeed.utils import safe_get_full_grad

        total = 0.0
        for p in self.params:
            g = safe_get_full_grad(p)
            if g is not None:
                total += float(g.float().pow(2).sum())
        return total**0.5

    def step(self, loss: Tensor) -> float | None:
        if not torch.isfinite(loss):
            return None
        self.engine.backward(loss)
        norm = self._grad_norm()
        if not torch.isfinite(torch.tensor(norm)):
            self.engine.zero_grad()
            return None
        self.engine.step()
        return norm

    def set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        if self.stage < 3:
            yield self.model
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            yield self.model


def make_optimizer(model: nn.Module, lr: float, max_grad_norm: float, zero_stage: int = 0, micro_batch: int = 1) -> Any:
    if zero_stage == 0:
        return TorchOptimizer(model, lr, max_grad_norm)
    return ZeroOptimizer(model, lr, max_grad_norm, zero_stage, micro_batch)
