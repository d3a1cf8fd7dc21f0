"""The private directory shared memory lives in (liveloop/transport/private_dir.py), under a base
directory of the test's own (a stand-in for /dev/shm: planting in the real one would touch other
processes): made 0700 and ours; a symlink or a file of ours under its name is replaced, a wider mode
narrowed, a name another user took (a directory or a symlink they own) passed over for the next one;
files are ours, 0600, created never through a symlink; engine copies whose process is gone are swept.
Tests that plant another user's files need root (chown)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid

import pytest

from liveloop.transport import TransportUnavailable
from liveloop.transport import private_dir

OTHER_UID = 54321  # a user that is not us
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="planting another user's file needs root (chown)")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_namespace_directory_is_made_private(tmp_path):
    path = private_dir.namespace_dir("ns1", base=tmp_path)
    assert path == tmp_path / f"liveloop-{os.getuid()}" / "ns1"
    for p in (path, path.parent):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and mode(p) == 0o700
    assert private_dir.namespace_dir("ns1", base=tmp_path) == path  # found again, unchanged


def test_a_wider_mode_is_narrowed_and_a_symlink_of_ours_replaced(tmp_path):
    root = tmp_path / f"liveloop-{os.getuid()}"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    assert private_dir.user_root(tmp_path) == root and mode(root) == 0o700
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "ns").symlink_to(elsewhere)  # a same-user process points our namespace somewhere else
    path = private_dir.namespace_dir("ns", base=tmp_path)
    assert not path.is_symlink() and path.is_dir() and mode(path) == 0o700
    assert list(elsewhere.iterdir()) == []  # nothing was made where the symlink pointed


@needs_root
def test_a_name_another_user_took_is_passed_over(tmp_path):
    squatted = tmp_path / f"liveloop-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    link = tmp_path / f"liveloop-{os.getuid()}-1"
    link.symlink_to(tmp_path)
    os.chown(link, OTHER_UID, OTHER_UID, follow_symlinks=False)
    root = private_dir.user_root(tmp_path)
    assert root == tmp_path / f"liveloop-{os.getuid()}-2"  # every process of ours walks the same list
    assert os.lstat(root).st_uid == os.getuid() and mode(root) == 0o700
    assert os.lstat(squatted).st_uid == OTHER_UID  # theirs is left alone


@needs_root
def test_every_name_taken_is_refused_clearly(tmp_path):
    for k in range(8):
        p = tmp_path / (f"liveloop-{os.getuid()}" if k == 0 else f"liveloop-{os.getuid()}-{k}")
        p.mkdir()
        os.chown(p, OTHER_UID, OTHER_UID)
    with pytest.raises(TransportUnavailable, match="taken by another user"):
        private_dir.user_root(tmp_path)


def test_files_are_ours_0600_and_never_made_through_a_symlink(tmp_path):
    folder = private_dir.namespace_dir("ns", base=tmp_path)
    buf = private_dir.create(folder / "a", 10)
    buf[:3] = b"abc"
    private_dir.close(buf)
    assert mode(folder / "a") == 0o600
    assert bytes(private_dir.open_mapped(folder / "a")[:3]) == b"abc"
    with pytest.raises(FileExistsError):  # O_EXCL: never one that exists
        private_dir.create(folder / "a", 10)
    target = tmp_path / "target"
    (folder / "b").symlink_to(target)
    with pytest.raises(FileExistsError):  # O_EXCL | O_NOFOLLOW: not through a symlink either
        private_dir.create(folder / "b", 10)
    assert not target.exists()
    target.write_bytes(b"xyz")
    os.chmod(target, 0o600)
    with pytest.raises(private_dir.ForeignFile):  # nor is one read through a symlink
        private_dir.open_mapped(folder / "b")
    (folder / "c").write_bytes(b"readable by all")
    os.chmod(folder / "c", 0o644)
    with pytest.raises(private_dir.ForeignFile, match="mode"):
        private_dir.open_mapped(folder / "c")


def test_engine_copies_of_a_killed_process_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"liveloop-weights-{dead_pid}-{uuid.uuid4().hex}"
    live = tmp_path / f"liveloop-weights-{os.getpid()}-{uuid.uuid4().hex}"
    legacy = tmp_path / f"liveloop-weights-{uuid.uuid4().hex}"  # no pid: whose it is cannot be told
    for p in (stale, live, legacy):
        p.write_bytes(b"w")
    assert private_dir.sweep_engine_copies(tmp_path) == [stale.name]
    assert not stale.exists() and live.exists() and legacy.exists()
