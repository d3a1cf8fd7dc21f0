"""Optimizer steps behind one small interface: plain torch AdamW (the default on one machine) or
DeepSpeed ZeRO stage 1-3 (for models that do not fit one device), for the policy and the critic alike.

    opt = make_optimizer(model, lr, max_grad_norm, zero_stage)
    out = opt.module(input_ids=...)        # forward through it (ZeRO-3 gathers parameters on the fly)
    norm = opt.step(loss)                  # backward, clip, step; None and no update if not finite
    opt.updates                            # updates begun so far (a step that failed midway: did it touch the weights?)
    opt.drop_grads()                       # after a step that failed midway (out of memory)
    opt.set_lr(lr)                         # the next steps' learning rate (step-size control)
    saved = opt.snapshot(); opt.restore(saved)   # undo an update (the trust region; torch AdamW only)
    with opt.full_parameters(): ...        # full weights, for checks and save_pretrained

ZeRO runs in one process on CPU too (gloo), which is how it is tested here; its C++ communication op
compiles once on first use into $TORCH_EXTENSIONS_DIR (about 2 minutes on this machine). Across N
ranks (`[learner] ranks`, learner/ranks.py) each rank builds its ZeroOptimizer in a process group the
group started (`world` = N); a rank's `micro_batch` is its share of the batch.
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
    """Plain AdamW. With `master_weights` and low-precision (e.g. bfloat16) parameters it steps an fp32
    copy of them, with fp32 moments, and writes the result back rounded (mixed precision): small updates
    that bfloat16 alone would round away accumulate in the copy."""

    def __init__(self, model: nn.Module, lr: float, max_grad_norm: float, master_weights: bool = True):
        self.module = model
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        low = any(p.dtype != torch.float32 for p in self.params)
        self.master = [p.detach().float().clone() for p in self.params] if master_weights and low else None
        # foreach: one call per update over every tensor (CUDA's default already); on the CPU it runs the same
        # per-tensor kernels in the same order as the loop it replaces, so the update is the same bit for bit
        self.optimizer = torch.optim.AdamW(self.master or self.params, lr=lr, weight_decay=0.0, foreach=True)
        self.max_grad_norm = max_grad_norm
        self.updates = 0

    def step(self, loss: Tensor) -> float | None:
        self.drop_grads()
        if not torch.isfinite(loss):
            return None
        loss.backward()
        stepped = self.params
        if self.master is not None:
            for m, p in zip(self.master, self.params):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None
            stepped = self.master
        norm = torch.nn.utils.clip_grad_norm_(stepped, self.max_grad_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.updates += 1
        self.optimizer.step()
        if self.master is not None:
            with torch.no_grad():
                for m, p in zip(self.master, self.params):
                    p.copy_(m)
        return float(norm)

    def drop_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None

    def snapshot(self) -> list[Tensor]:
        """The trained weights as they are now (the fp32 copy with master weights), for `restore`."""
        return [t.detach().clone() for t in (self.master or self.params)]

    def restore(self, snapshot: list[Tensor]) -> None:
        """Put back the weights of a `snapshot` (the trust region undoing an update)."""
        with torch.no_grad():
            for t, old in zip(self.master or self.params, snapshot):
                t.copy_(old)
            if self.master is not None:
                for m, p in zip(self.master, self.params):
                    p.copy_(m)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        yield self.model


def extensions_dir() -> str:
    """Where DeepSpeed's compiled ops are cached (compiled once per machine, shared by every rank)."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/liveloop/torch_extensions")


def _single_process_env() -> None:
    # One process, no MPI: DeepSpeed reads the torch.distributed variables.
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())


class ZeroOptimizer:
    """DeepSpeed ZeRO. With `world` = 1 it starts its own one-process group; with more, the process
    group is already up (learner/ranks.py) and every rank builds one of these on the same model."""

    def __init__(self, model: nn.Module, lr: float, max_grad_norm: float, stage: int, micro_batch: int = 1, world: int = 1):
        if world == 1:
            _single_process_env()
        import deepspeed

        self.model = model
        self.stage = stage
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        config = {
            "train_batch_size": micro_batch * world,
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
        self.updates = 0

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
        self.updates += 1
        self.engine.step()
        return norm

    def drop_grads(self) -> None:
        self.engine.zero_grad()

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


def make_optimizer(
    model: nn.Module, lr: float, max_grad_norm: float, zero_stage: int = 0, micro_batch: int = 1, master_weights: bool = True
) -> Any:
    if zero_stage == 0:
        return TorchOptimizer(model, lr, max_grad_norm, master_weights)
    return ZeroOptimizer(model, lr, max_grad_norm, zero_stage, micro_batch)
