"""The `checkpoint_dir` backend: a version travels as a checkpoint directory on disk, today's path. It
works across machines (any shared filesystem) and is durable by itself: its handle is the durable
checkpoint, so a learner using it writes nothing after.

Each `send` writes one safetensors shard into a temporary directory next to the final one; `finish`
adds the shard index (when there are several) and the base model's config files, then renames the
directory into place, so a reader never sees half a checkpoint; `abort` removes the temporary
directory. Tensors keep the served model's state_dict names (the engine reads them through
transformers' loader) and their bytes exactly; tied tensors are written once per name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from liveloop.checkpoint import checkpoint_digest, place
from liveloop.transport.base import HandleGone, Receiver, Sender, WeightHandle, WeightsUnverified, new_nonce
from liveloop.transport.config import TransportConfig
from liveloop.transport.weights import CheckpointDir, WeightSource

INDEX = "model.safetensors.index.json"
CONFIG_FILES = ("config.json", "generation_config.json")


class CheckpointDirSender(Sender):
    backend = "checkpoint_dir"
    durable = True

    def __init__(self, path_for: Callable[[int], Path], base_model: str | Path | None = None):
        """`path_for(version)`: the directory version `version` is written to (the learner's
        `checkpoint_root(...) / "policy"`); `base_model`: where config.json comes from."""
        super().__init__()
        self.path_for = path_for
        self.base_model = Path(base_model) if base_model is not None else None
        self._tmp: Path | None = None
        self._shards: list[tuple[str, list[str], int]] = []  # file, names, bytes

    def _start(self, version: int) -> None:
        final = Path(self.path_for(version))
        final.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._tmp.mkdir()
        self._shards = []

    def _send(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        assert self._tmp is not None
        state = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        _untie(state)
        name = f"model-{len(self._shards) + 1:05d}.safetensors"
        save_file(state, str(self._tmp / name), metadata={"format": "pt"})
        self._shards.append((name, list(state), sum(t.numel() * t.element_size() for t in state.values())))

    def _finish(self, version: int) -> WeightHandle:
        tmp, final = self._tmp, Path(self.path_for(version))
        assert tmp is not None
        if len(self._shards) == 1:
            os.replace(tmp / self._shards[0][0], tmp / "model.safetensors")
        elif self._shards:
            weight_map = {n: file for file, names, _ in self._shards for n in names}
            total = sum(size for *_, size in self._shards)
            (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
        if self.base_model is not None:
            for name in CONFIG_FILES:
                if (self.base_model / name).exists():
                    shutil.copy(self.base_model / name, tmp / name)
        digest = checkpoint_digest(tmp)
        place(tmp, final)
        self._tmp = None
        return WeightHandle(self.backend, version, str(final.resolve()), nonce=new_nonce(), digest=digest)

    def _abort(self, version: int) -> None:
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class CheckpointDirReceiver(Receiver):
    backend = "checkpoint_dir"

    def handle_for(
        self, version: int, checkpoint_path: str | None = None, *, nonce: str | None = None, digest: str | None = None
    ) -> WeightHandle:
        """`digest`: the checkpoint's sha256 (the row's `checkpoint_sha256`); the nonce is not checked
        here (the files' digest covers every byte read)."""
        if not checkpoint_path:
            raise HandleGone(f"checkpoint_dir: version {version} records no checkpoint path")
        return WeightHandle(self.backend, version, checkpoint_path, nonce=nonce, digest=digest)

    def handle_of(self, record) -> WeightHandle:  # noqa: ANN001
        return self.handle_for(record.version, record.checkpoint_path, nonce=record.weights_nonce, digest=record.checkpoint_sha256)

    @contextlib.contextmanager
    def open(self, handle: WeightHandle) -> Iterator[WeightSource]:
        path = Path(handle.location)
        if not is_checkpoint(path):
            raise HandleGone(f"checkpoint_dir: {path} is not a checkpoint directory (not written yet, or deleted)")
        verify_checkpoint(path, handle.digest, handle.version)
        yield CheckpointDir(path)

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        path = Path(handle.location)
        if not is_checkpoint(path):
            raise HandleGone(f"checkpoint_dir: {path} is not a checkpoint directory")
        verify_checkpoint(path, handle.digest, handle.version)
        state: dict[str, torch.Tensor] = {}
        for f in sorted(path.glob("*.safetensors")):
            state.update(load_file(str(f)))
        return state


def verify_checkpoint(path: str | Path, sha256: str | None, version: int | None = None) -> None:
    """WeightsUnverified unless the directory's safetensors files hash to `sha256` (None: nothing to
    check against, the base model or a row from before digests)."""
    if not sha256:
        return
    found = checkpoint_digest(path)
    if found != sha256:
        raise WeightsUnverified(f"checkpoint_dir: {path} hashes to {found}, version {version}'s row names {sha256}")


def is_checkpoint(path: str | Path) -> bool:
    """A directory holding safetensors weights (what `save_atomically` and `finish` put in place whole)."""
    try:
        path = Path(path)
        return path.is_dir() and any(path.glob("*.safetensors"))
    except OSError:
        return False


def _untie(state: dict[str, torch.Tensor]) -> None:
    # safetensors refuses tensors that share storage (tied embeddings): give each its own copy
    seen: set[int] = set()
    for name, t in list(state.items()):
        if t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            state[name] = t.clone()
        else:
            seen.add(ptr)


def sender(config: TransportConfig, path_for: Callable[[int], Path] | None = None, base_model: str | Path | None = None,
           client: Any = None) -> CheckpointDirSender:
    """The registry's constructor (`liveloop.transport.make_sender`): needs `path_for(version)`, where the
    version's policy directory goes, and `base_model` for its config.json."""
    if path_for is None:
        raise ValueError("checkpoint_dir transport: path_for is required")
    return CheckpointDirSender(path_for, base_model)


def receiver(config: TransportConfig) -> CheckpointDirReceiver:
    return CheckpointDirReceiver()
