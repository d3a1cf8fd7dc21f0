"""An operator's checkpoint (`POST /admin/weights`) copied into managed storage before it can serve.

The server never serves, restarts on or rolls back to a directory the operator owns: `WeightImports.stage`
copies it into the learner's `checkpoint_dir`, where learner versions live, and checks the copy (regular
files only, bounded, loadable weights of the serving model's shapes, complete, digested: `stage`); the
activator then records the version and moves the copy under the version's own name
(`checkpoint_dir/vNNNNNN/policy`, `StagedCheckpoint.record`). So deleting or changing the operator's
directory afterwards changes nothing, and the version is the learner's like any other: its cursor moves
there, it reloads from the copy, and retention prunes it like its own versions unless it is pinned.

Knows the store (to record the version) and the filesystem; not HTTP, not the engine.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import secrets
import shutil
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from liveloop.checkpoint import checkpoint_digest, fsync_dir, fsync_tree
from liveloop.checkpoint import checkpoint_root, delete_checkpoints, sweep_stale_staging
from liveloop.store import VersionRecord, VersionStatus, VersionTaken
from liveloop.store.versions import VersionQueries

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG_FILES = ("config.json", "generation_config.json")
# the files that define the tokens: an import that brings one must bring the serving model's
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt", "added_tokens.json")
TOKENIZER_FILES = VOCABULARY_FILES + ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
# config.json keys that record how a checkpoint was saved, not what it computes
IGNORED_CONFIG_KEYS = frozenset({"transformers_version", "dtype", "torch_dtype", "_name_or_path", "use_cache"})
# bytes per element of each safetensors dtype
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
_MAX_HEADER = 100 << 20  # what the safetensors library itself accepts
_BLOCK = 1 << 20


class ImportRefused(ValueError):
    """The operator's directory is not a checkpoint the server may take: `code` says why, the message
    names the file."""

    def __init__(self, path: str, message: str, code: str):
        super().__init__(message)
        self.path = path
        self.code = code


class ImportTooLarge(ImportRefused):
    """The checkpoint is larger than `[server] max_import_bytes`."""

    def __init__(self, path: str, message: str):
        super().__init__(path, message, "checkpoint_too_large")


class ImportFailed(RuntimeError):
    """The server could not write the copy (a full disk, permissions on checkpoint_dir): nothing was kept."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def wanted(name: str) -> bool:
    """Whether a file of the operator's directory is checkpoint content (copied) or left behind."""
    return name.endswith(".safetensors") or name in (INDEX, *CONFIG_FILES, *TOKENIZER_FILES)


def safetensors_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors a safetensors file holds, name -> (dtype, shape), after checking its header: it
    parses, every tensor's bytes match its dtype and shape, and together they cover the data exactly.
    Raises ValueError saying what is wrong."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"its header length ({length} bytes) does not fit the file ({size} bytes)")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            count = 1
            for d in shape:
                if not isinstance(d, int) or d < 0:
                    raise ValueError
                count *= d
            if dtype not in _DTYPE_BYTES or not (isinstance(begin, int) and isinstance(end, int)) or end - begin != count * _DTYPE_BYTES[dtype]:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: bad dtype, shape or data_offsets in its header") from None
        tensors[name] = (dtype, shape)
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise ValueError("its tensors' data does not cover the file contiguously")
        position = end
    if position != size - 8 - length:
        raise ValueError(f"its tensors hold {position} bytes of data, the file {size - 8 - length}")
    return tensors


def checkpoint_tensors(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint in `directory` (all its safetensors files), name -> (dtype, shape)."""
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors |= safetensors_tensors(f)
    return tensors


@dataclass
class StagedCheckpoint:
    """A checked copy of an operator's checkpoint, not yet a version: `staging` holds `policy/`."""

    source: str  # the operator's path (what messages name)
    staging: Path
    checkpoint_dir: Path
    digest: str
    size: int  # bytes copied from the operator's directory
    completed: tuple[str, ...]  # files taken from the serving model
    left_behind: tuple[str, ...]  # regular files of the operator's directory that are not checkpoint content
    version: int | None = field(default=None)  # once recorded

    @property
    def policy(self) -> Path:
        return self.staging / "policy"

    def record(self, versions: VersionQueries, parent: int, note: str | None = None, **row: Any) -> VersionRecord:
        """Record the version (LOADING) and move the copy under its name, in that order: the row claims
        the number (proposed, as the in-memory transport does: another writer taking it first means
        another proposal), so no other publish can take the directory; then the copy is renamed to
        `checkpoint_dir/vNNNNNN` (a directory a publish that never committed left there is replaced).
        If the rename fails the row becomes FAILED and ImportFailed is raised. Runs in a worker thread."""
        for _ in range(16):
            version = versions.next_version()
            root = checkpoint_root(self.checkpoint_dir, version)
            try:
                record = versions.add_version(
                    version, parent=parent, checkpoint_path=str(root / "policy"), checkpoint_sha256=self.digest,
                    status=VersionStatus.LOADING, note=note, **row,
                )
                break
            except VersionTaken:
                continue
        else:
            raise ImportFailed("could not claim a version number: other writers kept taking them")
        self.version = version
        try:
            if root.exists():
                shutil.rmtree(root)
            os.replace(self.staging, root)
            fsync_dir(self.checkpoint_dir)
        except OSError as exc:
            versions.fail_version(version)
            raise ImportFailed(f"could not move the copy of {self.source} to {root}: {exc}") from exc
        return record

    def abandon(self, versions: VersionQueries) -> None:
        """The import did not serve: remove the staging directory, or the placed copy of a version that
        has no row or a FAILED one (marked pruned first, as retention does). Never raises."""
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.version is None:
            return
        try:
            record = versions.get_version(self.version)
            if record is None or (record.status == VersionStatus.FAILED and versions.mark_pruned([self.version])):
                delete_checkpoints(self.checkpoint_dir, [self.version])
        except Exception:  # housekeeping: retention deletes a FAILED version's copy later
            log.exception("version %d: the copy of %s was not removed", self.version, self.source)


class WeightImports:
    """Copies operators' checkpoints into `checkpoint_dir` (the learner's) and checks them against the
    serving model in `serving_model` (its checkpoint directory)."""

    def __init__(self, checkpoint_dir: str | Path, serving_model: str | Path, max_bytes: int):
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        self.serving_model = Path(serving_model)
        self.max_bytes = max_bytes
        self._reference: dict[str, tuple[str, tuple[int, ...]]] | None = None
        sweep_stale_staging(self.checkpoint_dir)  # what imports (and publishes) of processes now gone left

    def stage(self, path: str) -> StagedCheckpoint:
        """Copy the checkpoint at `path` and check the copy. Raises ImportRefused, ImportTooLarge or
        ImportFailed, leaving nothing behind. Blocking: run it in a thread.

        What it accepts, checked on the copy (what will serve), never on the operator's files:
        1. regular files only: every entry is `lstat`ed before anything is opened, and one that is a symlink,
           FIFO, device, socket or directory refuses the import (a FIFO is never opened); files are opened
           with O_NOFOLLOW | O_NONBLOCK and must still be the file that was `lstat`ed;
        2. at most `max_bytes` copied (`[server] max_import_bytes`), checked before copying and while copying;
        3. loadable weights: `model.safetensors`, or shards named by `model.safetensors.index.json`; every
           header parses, its offsets cover the file, and the tensor names and shapes are the serving
           model's (its checkpoint on disk);
        4. complete: `config.json` must equal the serving model's apart from keys that change no computation
           (`IGNORED_CONFIG_KEYS`), and a vocabulary file must be the serving model's byte for byte (the server
           tokenizes with its own); what the directory lacks of both (a directory with only model.safetensors)
           is taken from the serving model, so the copy is a complete, startable checkpoint;
        5. its digest (`liveloop.checkpoint.checkpoint_digest` of the copy) goes in the row's checkpoint_sha256
           (what the activator verifies before the engine loads it), and the copy is fsynced.
        Other regular files (READMEs, optimizer states, pickled weights) are left behind. A refusal is an
        `ImportRefused` (`ImportTooLarge` past the bound) naming the offending file, a copy the server could
        not write an `ImportFailed`; either way nothing stays behind: the staging directory
        (`.staging-<pid>-import-*`, which `liveloop.checkpoint.sweep_stale_staging` removes after a crash) is
        deleted, and no row exists (or a FAILED one, if placing the copy failed after its row was written)."""
        try:
            is_dir = stat.S_ISDIR(os.stat(path).st_mode)
        except (OSError, ValueError):  # missing, a name too long, a permission, a NUL byte
            is_dir = False
        if not is_dir:
            raise ImportRefused(path, f"path: {path} is not a checkpoint directory with *.safetensors", "not_a_checkpoint")
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise ImportRefused(path, f"path: cannot read {path}: {exc.strerror}", "unreadable") from exc
        try:
            files, left = self._files(path, dfd)
            staging = self.checkpoint_dir / f".staging-{os.getpid()}-import-{secrets.token_hex(6)}"
            try:
                (staging / "policy").mkdir(parents=True)
            except OSError as exc:
                raise ImportFailed(f"could not create {staging}: {exc}") from exc
            try:
                for name, st in files:
                    self._copy(path, dfd, name, st, staging / "policy" / name)
                completed = self._check(path, staging / "policy", [name for name, _ in files])
                digest = checkpoint_digest(staging / "policy")
                fsync_tree(staging)  # durable before a row names it
            except OSError as exc:  # reading back our own copy
                shutil.rmtree(staging, ignore_errors=True)
                raise ImportFailed(f"could not check the copy of {path} in {staging}: {exc}") from exc
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        finally:
            os.close(dfd)
        return StagedCheckpoint(path, staging, self.checkpoint_dir, digest, sum(st.st_size for _, st in files), completed, left)

    # -- the steps --------------------------------------------------------------------------------------
    def _files(self, path: str, dfd: int) -> tuple[list[tuple[str, os.stat_result]], tuple[str, ...]]:
        """The files to copy with their lstat, safetensors first in name order, and the regular files left
        behind; refuses any entry that is not a regular file, a directory without safetensors and a
        total over max_bytes."""
        files, left = [], []
        try:
            entries = [(name, os.stat(name, dir_fd=dfd, follow_symlinks=False)) for name in sorted(os.listdir(dfd))]
        except OSError as exc:  # an entry that went while we looked, a permission
            raise ImportRefused(path, f"path: cannot list {path}: {exc.strerror}", "unreadable") from exc
        for name, st in entries:
            if not stat.S_ISREG(st.st_mode):
                hint = " (copy it with links resolved, e.g. cp -rL)" if stat.S_ISLNK(st.st_mode) else ""
                raise ImportRefused(
                    path, f"path: {os.path.join(path, name)} is a {_kind(st.st_mode)}; a checkpoint directory to import holds "
                    f"regular files only{hint}", "not_a_regular_file",
                )
            if wanted(name):
                files.append((name, st))
            else:
                left.append(name)
        if not any(name.endswith(".safetensors") for name, _ in files):
            raise ImportRefused(path, f"path: {path} is not a checkpoint directory with *.safetensors", "not_a_checkpoint")
        total = sum(st.st_size for _, st in files)
        if total > self.max_bytes:
            raise ImportTooLarge(path, f"path: {path} holds {total} bytes of checkpoint files; server.max_import_bytes is {self.max_bytes}")
        return sorted(files, key=lambda f: (not f[0].endswith(".safetensors"), f[0])), tuple(left)

    def _copy(self, path: str, dfd: int, name: str, st: os.stat_result, dest: Path) -> None:
        """Copy one regular file, opened without following a link and without blocking (a FIFO put in its
        place since the lstat is seen as one, never read), checked to be the file that was lstat'ed."""
        where = os.path.join(path, name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            raise ImportRefused(path, f"path: cannot open {where}: {exc.strerror}", "unreadable") from exc
        with os.fdopen(fd, "rb") as src:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise ImportRefused(path, f"path: {where} changed while it was imported", "changed")
            try:
                out = open(dest, "xb")
            except OSError as exc:
                raise ImportFailed(f"could not write {dest}: {exc}") from exc
            with out:
                copied = 0
                while True:
                    try:
                        block = src.read(_BLOCK)
                    except OSError as exc:
                        raise ImportRefused(path, f"path: cannot read {where}: {exc.strerror}", "unreadable") from exc
                    if not block:
                        break
                    copied += len(block)
                    if copied > st.st_size:  # it grows while we copy: the bound was checked on its size
                        raise ImportRefused(path, f"path: {where} changed while it was imported", "changed")
                    try:
                        out.write(block)
                    except OSError as exc:
                        raise ImportFailed(f"could not write {dest}: {exc}") from exc

    def _check(self, path: str, copy: Path, names: list[str]) -> tuple[str, ...]:
        """Check the copy (weights, config, vocabulary) and complete it from the serving model; returns
        the files taken from the serving model."""
        self._check_weights(path, copy, names)
        serving = self.serving_model
        if "config.json" in names:
            try:
                theirs = json.loads((copy / "config.json").read_text())
                ours = json.loads((serving / "config.json").read_text())
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ImportRefused(path, f"path: {path}/config.json is not JSON", "config_mismatch") from None
            if not isinstance(theirs, dict):
                raise ImportRefused(path, f"path: {path}/config.json is not a JSON object", "config_mismatch")
            differ = sorted(k for k in (set(theirs) | set(ours)) - IGNORED_CONFIG_KEYS if theirs.get(k) != ours.get(k))
            if differ:
                raise ImportRefused(
                    path, f"path: {path}/config.json differs from the serving model's in {', '.join(differ[:8])}: "
                    "an import is weights for the serving model's architecture", "config_mismatch",
                )
        for name in VOCABULARY_FILES:
            if name in names and (serving / name).is_file() and not filecmp.cmp(copy / name, serving / name, shallow=False):
                raise ImportRefused(
                    path, f"path: {path}/{name} is not the serving model's: the server tokenizes with its own tokenizer", "tokenizer_mismatch",
                )
        completed = []
        for name in (*CONFIG_FILES, *TOKENIZER_FILES):
            if name not in names and (serving / name).is_file():
                try:
                    shutil.copyfile(serving / name, copy / name)
                except OSError as exc:
                    raise ImportFailed(f"could not write {copy / name}: {exc}") from exc
                completed.append(name)
        return tuple(completed)

    def _check_weights(self, path: str, copy: Path, names: list[str]) -> None:
        shards = sorted(n for n in names if n.endswith(".safetensors"))
        if INDEX in names:
            try:
                weight_map = json.loads((copy / INDEX).read_text())["weight_map"]
                files = set(weight_map.values())
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise ImportRefused(path, f"path: {path}/{INDEX} has no weight_map", "unloadable_weights") from None
            if files != set(shards):
                raise ImportRefused(path, f"path: {path}/{INDEX} names {sorted(files)}, the directory holds {shards}", "unloadable_weights")
        elif shards != [WEIGHTS]:
            raise ImportRefused(path, f"path: {path} holds {shards} without {INDEX}: one {WEIGHTS}, or shards with an index", "unloadable_weights")
        else:
            weight_map = None
        tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        for shard in shards:
            try:
                found = safetensors_tensors(copy / shard)
            except ValueError as exc:
                raise ImportRefused(path, f"path: {path}/{shard} is not a safetensors file: {exc}", "unloadable_weights") from None
            if set(found) & set(tensors):
                raise ImportRefused(path, f"path: {path}: tensors {sorted(set(found) & set(tensors))[:5]} are in two shards", "unloadable_weights")
            tensors |= found
        if weight_map is not None and set(weight_map) != set(tensors):
            raise ImportRefused(path, f"path: {path}/{INDEX} does not name the tensors its shards hold", "unloadable_weights")
        if self._reference is None:
            self._reference = checkpoint_tensors(self.serving_model)
        ours = self._reference
        missing, extra = sorted(set(ours) - set(tensors)), sorted(set(tensors) - set(ours))
        shapes = [f"{n} is {list(tensors[n][1])} (the serving model's: {list(ours[n][1])})" for n in sorted(ours) if n in tensors and tensors[n][1] != ours[n][1]]
        if missing or extra or shapes:
            parts = ([f"missing {missing[:5]}"] if missing else []) + ([f"unexpected {extra[:5]}"] if extra else []) + shapes[:5]
            raise ImportRefused(path, f"path: {path}'s tensors are not the serving model's: {'; '.join(parts)}", "tensor_mismatch")
