"""Checkpoint directories shared by the learner and the server: content digests and atomic, durable
saves (the files and the directory fsynced before the rename, the parent after it: a version row that
names a checkpoint is written only once the checkpoint would survive a power loss), and the managed
storage's layout: `checkpoint_dir/v{version:06d}` per version (`checkpoint_root`), deleting versions'
directories (`delete_checkpoints`), and sweeping the `.staging-<pid>-*` directories of a process that
died (`sweep_stale_staging`). Which versions to delete is the learner's retention policy
(`liveloop.learner.retention`)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

BASE_VERSION = 0  # the base model: it lives outside checkpoint_dir and is never deleted
# transformers' from_pretrained is not thread-safe within a process (its meta-device initialisation is
# process-wide: two loads at once gave meta tensors). A serving process loads in several threads (the
# live engine's swaps, the release gate's candidate engine, the evaluation's scorer): each load holds it.
PRETRAINED_LOCK = threading.Lock()


def checkpoint_digest(path: str | Path) -> str:
    """sha256 over the directory's *.safetensors files, in name order."""
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
    write(tmp)
    return place(tmp, final)


def place(tmp: Path, final: Path) -> Path:
    """fsync everything under `tmp`, rename it to `final` (replacing what is there), then fsync the
    parent: the second half of `save_atomically`, for writers that fill `tmp` themselves."""
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


def _alive(pid: int) -> bool:
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
        if (m := _STAGING.match(p.name)) and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1)))
    ]
    for path in stale:
        log.warning("removing %s: a publish of a learner process that is gone", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
