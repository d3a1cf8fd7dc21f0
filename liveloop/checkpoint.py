"""Checkpoint directories shared by the learner and the server: content digests and atomic, durable
saves (the files and the directory fsynced before the rename, the parent after it: a version row that
names a checkpoint is written only once the checkpoint would survive a power loss), and the managed
storage's layout: `checkpoint_dir/v{version:06d}` per version (`checkpoint_root`), deleting versions'
directories (`delete_checkpoints`), and sweeping the `.staging-<pid>-*` directories of a process that
died (`sweep_stale_staging`). Which versions to delete is the learner's retention policy
(`liveloop.learner.retention`). A saved directory (and each directory under it) is 0700: only this
user reads or changes a checkpoint.

Digests (a version row's `checkpoint_sha256`, a build's `model_digest`) come in two kinds:
- `sha256-all:<b64>` (`checkpoint_digest`, what every writer records; the sha256 in unpadded
  base64url, 43 characters, so the whole fits the store's 64-character column): every file under the
  directory, by relative name in sorted order, each framed as its name's length and bytes, its size,
  then its contents. So config.json, generation_config.json, the tokenizer's files and an adapter's
  adapter_config.json are covered as well as the weights, and a renamed, added or removed file
  changes it. A symlink, FIFO or other non-regular entry is refused (`CheckpointEntryRefused`).
  Only the builds' records (`UNREAD`: `liveloop_build.json`, `liveloop_diffusion_build.json`, which
  name the digest and hold timings; no engine reads them) are left out.
- a bare 64-hex sha256 (`legacy_digest`): what rows written before this kind hold. It covers the
  concatenated bytes of the top-level `*.safetensors` files, in name order, and nothing else: such a
  version's config and tokenizer files are not verified (they load as they are when it is copied).
`liveloop.transport.checkpoint_dir` verifies both kinds and copies what it verified
(`verified_copy`), so an engine loads the bytes that were hashed."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

BASE_VERSION = 0  # the base model: it lives outside checkpoint_dir and is never deleted
# transformers' from_pretrained is not thread-safe within a process (its meta-device initialisation is
# process-wide: two loads at once gave meta tensors). A serving process loads in several threads (the
# live engine's swaps, the release gate's candidate engine, the evaluation's scorer): each load holds it.
PRETRAINED_LOCK = threading.Lock()


DIGEST_KIND = "sha256-all"  # the prefix of a digest over every file (a bare hex digest is `legacy_digest`'s)
# top-level files no engine reads, left out of the digest: the builds' records (liveloop/model/build.py,
# diffusion/sft.py), which hold their build's timings and name its digest
UNREAD = frozenset({"liveloop_build.json", "liveloop_diffusion_build.json"})


class CheckpointEntryRefused(ValueError):
    """A checkpoint directory holds something that is not a regular file or a directory (a symlink,
    a FIFO, a device, a socket): it has no digest."""


class CheckpointHasher:
    """The `sha256-all` digest, fed file by file in `checkpoint_files` order: `file(name, size)`, then
    that file's bytes (`update`), then the next file."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def file(self, name: str, size: int) -> None:
        encoded = name.encode("utf-8")
        self._h.update(len(encoded).to_bytes(8, "big") + encoded + size.to_bytes(8, "big"))

    def update(self, block: bytes) -> None:
        self._h.update(block)

    def digest(self) -> str:
        return f"{DIGEST_KIND}:{base64.urlsafe_b64encode(self._h.digest()).rstrip(b'=').decode()}"


def checkpoint_files(path: str | Path) -> list[str]:
    """Every file under the directory `path`, by relative POSIX name, sorted (without `UNREAD`).
    Raises CheckpointEntryRefused for an entry that is neither a regular file nor a directory."""
    root = Path(path)
    names = []
    for folder, dirs, files in os.walk(root, onerror=_raise):
        for name in dirs + files:
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if stat.S_ISDIR(mode) and name in dirs:
                continue
            if not stat.S_ISREG(mode):
                raise CheckpointEntryRefused(f"{os.path.join(folder, name)} is not a regular file")
            rel = Path(folder, name).relative_to(root).as_posix()
            if rel not in UNREAD:
                names.append(rel)
    return sorted(names)


def _raise(exc: OSError) -> None:
    raise exc


def checkpoint_digest(path: str | Path) -> str:
    """The `sha256-all:<b64>` digest of the directory: every file's name, size and bytes (see the
    module docstring)."""
    h = CheckpointHasher()
    for name in checkpoint_files(path):
        f = Path(path) / name
        with f.open("rb") as fh:
            h.file(name, os.fstat(fh.fileno()).st_size)
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.digest()


def legacy_digest(path: str | Path) -> str:
    """The old kind (bare hex): sha256 over the directory's top-level *.safetensors files, in name
    order, and nothing else. Only to check rows written before `checkpoint_digest`'s kind."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def fsync_tree(path: str | Path) -> None:
    """fsync every file under `path`, then every directory, deepest first (so their entries are durable)."""
    path = Path(path)
    dirs = []
    for root, _, files in os.walk(path):
        dirs.append(root)
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for root in reversed(dirs):
        fsync_dir(root)


def private_tree(path: str | Path) -> None:
    """chmod 0700 `path` and every directory under it (no symlink is followed): only this user lists,
    reads or changes what is there."""
    for root, _, _ in os.walk(path):  # symlinked directories are listed, never entered
        os.chmod(root, 0o700)


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp_dir)`, fsync what it wrote, and rename the result to `final` (then fsync its
    parent): a reader never sees half a checkpoint, and a row written after this names a durable one."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        write(tmp)
    except BaseException:  # nothing half-written stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return place(tmp, final)


def file_sha256(path: str | Path) -> str:
    """The sha256 of one file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def place(tmp: Path, final: Path) -> Path:
    """Make `tmp` and every directory under it 0700, fsync everything under it, rename it to `final`
    (replacing what is there), then fsync the parent: the second half of `save_atomically`, for
    writers that fill `tmp` themselves."""
    private_tree(tmp)
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return final


def checkpoint_root(checkpoint_dir: str | Path, version: int) -> Path:
    """The directory holding `version`'s policy and critic."""
    return Path(checkpoint_dir).resolve() / f"v{version:06d}"


def delete_checkpoints(checkpoint_dir: str | Path, versions: Iterable[int]) -> list[int]:
    """Delete each version's directory (policy and critic together); returns the versions whose
    directory is gone afterwards. Errors are logged, never raised: a failed deletion wastes disk,
    it does not stop learning."""
    gone = []
    for version in versions:
        if version == BASE_VERSION:
            continue
        root = checkpoint_root(checkpoint_dir, version)
        try:
            shutil.rmtree(root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("could not delete the checkpoint of version %d at %s: %s", version, root, exc)
            continue
        gone.append(version)
    return gone


# a publish's staging directory (`.staging-<pid>-<lane>`) and save_atomically's temporary beside it
_STAGING = re.compile(r"^\.\.?staging-(\d+)-")


def process_alive(pid: int) -> bool:
    """Whether process `pid` is alive (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep_stale_staging(checkpoint_dir: str | Path) -> list[Path]:
    """Remove the staging directories a crashed process (a learner's publish, a server's import) left
    under `checkpoint_dir` (those of a pid that is no longer alive; this process's and live ones' are
    theirs). Returns what it removed."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    stale = [
        p for p in root.iterdir()
        if (m := _STAGING.match(p.name)) and int(m.group(1)) != os.getpid() and not process_alive(int(m.group(1)))
    ]
    for path in stale:
        log.warning("removing %s: a publish of a learner process that is gone", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
