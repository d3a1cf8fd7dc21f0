"""Checkpoint retention for the learner: which published versions' checkpoints to delete, and telling a
full disk from other save failures. The storage layout itself (`checkpoint_root`, `delete_checkpoints`,
`sweep_stale_staging`) is `liveloop.checkpoint`'s, which the server's imports share.

Every published version is a directory `checkpoint_dir/v{version:06d}` holding `policy/` and `critic/`;
an operator's import (`POST /admin/weights`, server/control/weights_import.py) is copied there too, as `policy/`
alone, and retention treats it like the learner's own versions: pin it to keep it for ever.
Retention (`versions_to_prune`, pure) keeps:
  - every "serving" version and its parent chain up to K ancestors (what a rollback most likely wants),
  - every pinned version (the operator's choice),
  - the newest N versions that still have a checkpoint,
  - version 0 (the base model: it lives outside checkpoint_dir and is never deleted),
  - anything not yet activated ("loading", "published"; `store.status.NEVER_PRUNED`), and whatever the
    caller protects (the learner: the version it trains from and the one it just published).
Everything else that still has a checkpoint (`pruned_at` is None) goes. The caller marks the victims
pruned in the store first (`store.versions.mark_pruned` re-checks each row in its transaction and also spares
any version a learner's cursor points at), then deletes the directories of the rows it marked
(`liveloop.checkpoint.delete_checkpoints`, which never raises).

A publish writes its checkpoint under `.staging-<pid>-<lane>` first (the store names it vNNNNNN inside
the inserting transaction), an import under `.staging-<pid>-import-<random>`; `sweep_stale_staging`
removes those of a process (learner or server) that died.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path

from liveloop.checkpoint import BASE_VERSION, checkpoint_root
from liveloop.store import VersionRecord, VersionStatus
from liveloop.store.status import NEVER_PRUNED


# a save that fails with one of these ran out of room (space, quota, or a file-size limit)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_RUST_OS_ERROR = re.compile(r"os error (\d+)")  # safetensors reports I/O errors as "... (os error 28)"
_DISK_FULL_MESSAGES = tuple(os.strerror(e).lower() for e in DISK_FULL_ERRNOS) + ("database or disk is full",)


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
