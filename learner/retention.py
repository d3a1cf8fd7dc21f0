"""Checkpoint storage for the learner: which published versions' checkpoints to delete (retention),
deleting them, and telling a full disk from other save failures.

Every published version is a directory `checkpoint_dir/v{version:06d}` holding `policy/` and `critic/`;
an operator's import (`POST /admin/weights`, server/weights_import.py) is copied there too, as `policy/`
alone, and retention treats it like the learner's own versions: pin it to keep it for ever.
Retention (`versions_to_prune`, pure) keeps:
  - every "serving" version and its parent chain up to K ancestors (what a rollback most likely wants),
  - every pinned version (the operator's choice),
  - the newest N versions that still have a checkpoint,
  - version 0 (the base model: it lives outside checkpoint_dir and is never deleted),
  - anything not yet activated ("loading", "published"; `store.status.NEVER_PRUNED`), and whatever the
    caller protects (the learner: the version it trains from and the one it just published).
Everything else that still has a checkpoint (`pruned_at` is None) goes. The caller marks the victims
pruned in the store first (`Store.mark_pruned` re-checks each row in its transaction and also spares
any version a learner's cursor points at), then deletes the directories of the rows it marked
(`delete_checkpoints`, which never raises).

A publish writes its checkpoint under `.staging-<pid>-<lane>` first (the store names it vNNNNNN inside
the inserting transaction), an import under `.staging-<pid>-import-<random>`; `sweep_stale_staging`
removes those of a process (learner or server) that died.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from liveloop.store import VersionRecord, VersionStatus
from liveloop.store.status import NEVER_PRUNED

log = logging.getLogger(__name__)

BASE_VERSION = 0
# a save that fails with one of these ran out of room (space, quota, or a file-size limit)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_RUST_OS_ERROR = re.compile(r"os error (\d+)")  # safetensors reports I/O errors as "... (os error 28)"
_DISK_FULL_MESSAGES = tuple(os.strerror(e).lower() for e in DISK_FULL_ERRNOS) + ("database or disk is full",)


def checkpoint_root(checkpoint_dir: str | Path, version: int) -> Path:
    """The directory holding `version`'s policy and critic."""
    return Path(checkpoint_dir).resolve() / f"v{version:06d}"


def in_checkpoint_dir(record: VersionRecord, checkpoint_dir: str | Path) -> bool:
    """Whether `record`'s weights are in managed storage, `checkpoint_dir/vNNNNNN/policy` (the learner's
    versions and operators' imports; a row that names a directory elsewhere, as operators' publishes
    did before imports were copied, is not retention's to delete)."""
    if not record.checkpoint_path:
        return False
    return Path(record.checkpoint_path).resolve().parent == checkpoint_root(checkpoint_dir, record.version)


def versions_to_prune(
    versions: Sequence[VersionRecord],
    keep_last: int,
    keep_parent_chain: int,
    protect: Collection[int] = (),
) -> list[int]:
    """The versions whose checkpoints retention deletes, in ascending order (see the module docstring)."""
    by_version = {r.version: r for r in versions}
    stored = sorted(r.version for r in versions if r.pruned_at is None and r.checkpoint_path)
    keep = {BASE_VERSION, *protect}
    keep.update(stored[-keep_last:] if keep_last > 0 else ())
    for r in versions:
        if r.pinned or r.status in NEVER_PRUNED:
            keep.add(r.version)
        if r.status == VersionStatus.SERVING:
            parent = r.parent
            for _ in range(keep_parent_chain):
                if parent is None or parent not in by_version:
                    break
                keep.add(parent)
                parent = by_version[parent].parent
    return [v for v in stored if v not in keep]


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


def is_disk_full(exc: BaseException) -> bool:
    """Whether a failed save ran out of room: an OSError with ENOSPC, EDQUOT or EFBIG anywhere in the
    exception's chain, or an error that reports one by message (safetensors' "(os error 28)", SQLite's
    "database or disk is full", PostgreSQL's "No space left on device")."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        text = str(e).lower()
        if any(int(code) in DISK_FULL_ERRNOS for code in _RUST_OS_ERROR.findall(text)):
            return True
        if any(m in text for m in _DISK_FULL_MESSAGES):
            return True
        orig = getattr(e, "orig", None)  # SQLAlchemy wraps the driver's error
        todo += [e.__cause__, e.__context__, orig if isinstance(orig, BaseException) else None]
    return False


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
