"""Checkpoint retention on hand-built version histories (expected victims computed by hand), which
versions are the learner's own to delete, and which save failures count as a full disk."""

from __future__ import annotations

import errno
from datetime import datetime, timezone

import pytest
from safetensors import SafetensorError

from liveloop.checkpoint import delete_checkpoints
from liveloop.learner.retention import in_checkpoint_dir, is_disk_full, versions_to_prune
from liveloop.store import VersionRecord

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _v(version: int, status: str = "retired", parent: int | None = -1, pinned: bool = False, pruned: bool = False, path: str | None = "ckpt") -> VersionRecord:
    return VersionRecord(
        version=version,
        parent=(version - 1 if version > 0 else None) if parent == -1 else parent,
        created_at=T0,
        checkpoint_path=path,
        checkpoint_sha256=None,
        learner_step=0,
        samples_used=0,
        status=status,
        pinned=pinned,
        pruned_at=T0 if pruned else None,
    )


def test_linear_history_keeps_serving_chain_and_newest():
    # 0 <- 1 <- ... <- 10, version 6 serving; N=2 keeps 9, 10; K=2 keeps 5, 4; 0 is the base
    versions = [_v(i) for i in range(11)]
    versions[6] = _v(6, "serving")
    assert versions_to_prune(versions, keep_last=2, keep_parent_chain=2) == [1, 2, 3, 7, 8]


def test_not_yet_activated_and_pinned_are_kept():
    versions = [_v(0, "retired"), _v(1, pinned=True), _v(2), _v(3, "serving"), _v(4, "loading"), _v(5, "published"), _v(6, "superseded"), _v(7, "published")]
    # N=1 keeps 7; K=0 keeps no ancestor of 3; 4 loading, 5 published, 1 pinned
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=0) == [2, 6]


def test_already_pruned_and_weightless_versions_are_not_victims_nor_counted():
    versions = [_v(0), _v(1, pruned=True), _v(2), _v(3, pruned=True), _v(4, "failed"), _v(5, path=None), _v(6, "serving")]
    # with a checkpoint: 0, 2, 4, 6; the newest two of them are 4 and 6; 5 has none to delete
    assert versions_to_prune(versions, keep_last=2, keep_parent_chain=0) == [2]


def test_parent_chain_follows_parents_across_a_rollback_branch():
    # 0 <- 1 <- 2 <- 3 (rolled back), then 4 and 5 trained on 2 again; 5 serving
    versions = [_v(0), _v(1), _v(2), _v(3, "rolled_back"), _v(4, parent=2), _v(5, "serving", parent=4), _v(6, "rolled_back", parent=5), _v(7, "rolled_back", parent=6)]
    # K=3: 4, 2, 1; N=1: 7
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=3) == [3, 6]
    # K=1: 4 only
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=1) == [1, 2, 3, 6]


def test_two_serving_versions_and_protected_ones_are_kept():
    versions = [_v(0), _v(1), _v(2, "serving"), _v(3), _v(4), _v(5, "serving"), _v(6), _v(7), _v(8)]
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=1) == [3, 6, 7]
    # the learner protects the version it trains from and the one it just published
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=1, protect=(6, 7)) == [3]


def test_base_version_is_never_a_victim():
    versions = [_v(0, "retired"), _v(1), _v(2), _v(3, "serving", parent=None)]
    assert versions_to_prune(versions, keep_last=1, keep_parent_chain=0) == [1, 2]


def test_only_versions_under_checkpoint_dir_are_the_learners(tmp_path):
    root = tmp_path / "versions"
    assert in_checkpoint_dir(_v(3, path=str(root / "v000003" / "policy")), root)
    assert not in_checkpoint_dir(_v(3, path=str(root / "v000004" / "policy")), root)  # another version's dir
    assert not in_checkpoint_dir(_v(3, path=str(tmp_path / "uploaded")), root)  # published by an operator
    assert not in_checkpoint_dir(_v(3, path=None), root)


def test_delete_checkpoints_removes_policy_and_critic_and_never_raises(tmp_path):
    for v in (0, 1, 2):
        for part in ("policy", "critic"):
            (tmp_path / f"v{v:06d}" / part).mkdir(parents=True)
            (tmp_path / f"v{v:06d}" / part / "model.safetensors").write_bytes(b"x")
    (tmp_path / "v000003").write_text("a file where a directory should be")
    # 0 is the base (kept), 4 does not exist (already gone), 3 cannot be rmtree'd (logged, not raised)
    assert delete_checkpoints(tmp_path, [0, 1, 3, 4]) == [1, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000000", "v000002", "v000003"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_disk_full_errors(code):
    assert is_disk_full(OSError(code, "full"))
    try:
        try:
            raise OSError(code, "full")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert is_disk_full(SafetensorError(f"Error while serializing: I/O error: full (os error {code})"))


def test_other_errors_are_not_disk_full():
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)"))
    assert not is_disk_full(ValueError("bad shape"))
