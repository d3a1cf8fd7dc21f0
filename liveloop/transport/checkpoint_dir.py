"""The `checkpoint_dir` backend: a version travels as a checkpoint directory on disk, today's path. It
works across machines (any shared filesystem) and is durable by itself: its handle is the durable
checkpoint, so a learner using it writes nothing after.

Each `send` writes one safetensors shard into a temporary directory next to the final one; `finish`
adds the shard index (when there are several) and the base model's config files, then renames the
directory into place, so a reader never sees half a checkpoint; `abort` removes the temporary
directory. Tensors keep the served model's state_dict names (the engine reads them through
transformers' loader) and their bytes exactly; tied tensors are written once per name. The handle's
digest is `liveloop.checkpoint.checkpoint_digest`'s: every file of the directory, config included.

Reading one (`verified_copy`, what `open`, the publisher, start-up and the release gate's candidates
use): every file is copied into a private directory (`liveloop-verified-<pid>-*` under the temporary
directory, 0700, created by this process) while the bytes read are hashed, and only a copy whose
digest is the row's is handed on; the engine loads the copy, which is removed once it has loaded
(`PrivateCopy.close`, or when the copy is garbage). So a file changed after it was hashed is never what
loads: the shared directory is read once. A row's digest of the old kind (bare hex: the safetensors
only, `liveloop.checkpoint.legacy_digest`) is checked as it was, and the copy's other files are taken as
they were read. No digest (the base model, a row from before digests) means nothing to check: the
directory is used in place. Copies of processes that died are removed at a process's first copy.
`verify_checkpoint` checks a directory in place (for callers that load nothing from it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from liveloop.checkpoint import (
    DIGEST_KIND,
    CheckpointEntryRefused,
    CheckpointHasher,
    checkpoint_digest,
    checkpoint_files,
    legacy_digest,
    place,
)
from liveloop.temp_dirs import owned_temp_dir, sweep
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
        self._tmp.mkdir(mode=0o700)
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
        with verified_copy(path, handle.digest, handle.version) as copy:
            yield CheckpointDir(copy.path)  # the copy that was hashed, never the shared directory again

    def tensors(self, handle: WeightHandle) -> dict[str, torch.Tensor]:
        path = Path(handle.location)
        if not is_checkpoint(path):
            raise HandleGone(f"checkpoint_dir: {path} is not a checkpoint directory")
        state: dict[str, torch.Tensor] = {}
        with verified_copy(path, handle.digest, handle.version) as copy:
            for f in sorted(copy.path.glob("*.safetensors")):
                state.update(load_file(str(f)))
        return state


_LEGACY = re.compile(r"[0-9a-f]{64}")
COPY_KIND = "verified"  # liveloop/temp_dirs.py: liveloop-verified-PID-*, swept when PID is gone


class PrivateCopy:
    """A checkpoint directory as an engine may load it: `path`, this process's private copy (removed by
    `close`, at the end of a `with`, or once the object is garbage), or, where there was nothing to
    verify, the directory itself (never removed)."""

    def __init__(self, path: Path, owned: bool):
        self.path = path
        self.owned = owned
        self._remove = weakref.finalize(self, shutil.rmtree, str(path), True) if owned else None

    def close(self) -> None:
        if self._remove is not None:
            self._remove()

    def __enter__(self) -> PrivateCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verify_checkpoint(path: str | Path, sha256: str | None, version: int | None = None) -> None:
    """WeightsUnverified unless the directory hashes to `sha256`, a digest of either kind (None: nothing
    to check against, the base model or a row from before digests). Checks in place: what loads
    afterwards is read again, so a loader takes `verified_copy` instead."""
    if not sha256:
        return
    legacy = _kind(path, sha256, version)
    try:
        found = legacy_digest(path) if legacy else checkpoint_digest(path)
    except (OSError, CheckpointEntryRefused) as exc:
        raise WeightsUnverified(f"checkpoint_dir: {path} cannot be hashed ({exc}): version {version}'s row names {sha256}") from None
    if found != sha256:
        raise WeightsUnverified(f"checkpoint_dir: {path} hashes to {found}, version {version}'s row names {sha256}")


def verified_copy(path: str | Path, sha256: str | None, version: int | None = None) -> PrivateCopy:
    """The directory copied into a private directory while its bytes are hashed; WeightsUnverified
    (and no copy left) unless they hash to `sha256`. None: nothing to check, the directory itself."""
    source = Path(path)
    if not sha256:
        return PrivateCopy(source, owned=False)
    legacy = _kind(source, sha256, version)
    copy = private_copy_dir()
    try:
        found = _copy_hashing(source, copy.path, legacy)
    except (OSError, CheckpointEntryRefused) as exc:
        copy.close()
        raise WeightsUnverified(f"checkpoint_dir: {source} cannot be read whole ({exc}): version {version}'s row names {sha256}") from None
    except BaseException:
        copy.close()
        raise
    if found != sha256:
        copy.close()
        raise WeightsUnverified(f"checkpoint_dir: {source} hashes to {found}, version {version}'s row names {sha256}")
    return copy


def private_copy(path: str | Path) -> PrivateCopy:
    """The directory copied as it is into a private one (nothing checked): for an engine that keeps a
    directory it was handed (already verified, already private) after the caller removes it."""
    copy = private_copy_dir()
    try:
        _copy_hashing(Path(path), copy.path, legacy=False)
    except BaseException:
        copy.close()
        raise
    return copy


def private_copy_dir() -> PrivateCopy:
    """A new, empty 0700 directory of this process under the temporary directory, owned (removed on close)."""
    return PrivateCopy(owned_temp_dir(COPY_KIND), owned=True)


def sweep_stale_copies(root: str | Path | None = None) -> list[Path]:
    """Remove the private copies that processes no longer alive left under the temporary directory."""
    return sweep(COPY_KIND, root)


def _kind(path: str | Path, sha256: str, version: int | None) -> bool:
    """Whether `sha256` is the old kind (bare hex); WeightsUnverified when it is of no known kind."""
    if sha256.startswith(f"{DIGEST_KIND}:"):
        return False
    if _LEGACY.fullmatch(sha256):
        return True
    raise WeightsUnverified(f"checkpoint_dir: version {version}'s row names a digest of no known kind ({sha256!r}) for {path}")


def _copy_hashing(source: Path, dest: Path, legacy: bool) -> str:
    """Copy every file of `source` (`checkpoint_files`) into `dest`, hashing the bytes as they are read:
    the digest of what `dest` now holds, of the kind asked for. A file whose size changes while it is
    read is refused (CheckpointEntryRefused)."""
    full, old = CheckpointHasher(), hashlib.sha256()
    for name in checkpoint_files(source):
        weights = "/" not in name and name.endswith(".safetensors")  # what a legacy digest covers
        target = dest / name
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(source / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointEntryRefused(f"{source / name} is not a regular file")
            full.file(name, st.st_size)
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            read = 0
            with os.fdopen(fd, "rb", closefd=False) as src, os.fdopen(out, "wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    full.update(block)
                    if weights:
                        old.update(block)
                    dst.write(block)
                    read += len(block)
        finally:
            os.close(fd)
        if read != st.st_size:
            raise CheckpointEntryRefused(f"{source / name} changed size while it was read ({st.st_size} -> {read} bytes)")
    return old.hexdigest() if legacy else full.digest()


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
