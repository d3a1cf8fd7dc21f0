"""Where a deployment's weights sit in shared memory: a directory only this user can enter, never a
predictable name in /dev/shm that anyone may create first.

    /dev/shm/liveloop-<uid>/            0700, owned by us (checked with lstat: no symlink, our uid)
        <namespace>/                    0700, one per deployment (its random id, from the store)
            v00000007.m                 files: created O_EXCL | O_NOFOLLOW, 0600, then mmap'd
            v00000007.<nonce>.0000

A directory that is not ours is never used: a symlink we own is removed and made again, a mode
wider than 0700 narrowed; one another user planted (a symlink or a directory they own, which the
sticky /dev/shm will not let us remove) is reported and passed over for the next candidate name
(`liveloop-<uid>-1`, ... up to `-7`): every process of the deployment walks the same list, so they
agree. Files are opened O_NOFOLLOW and checked with fstat (regular, our uid, no group/other bits);
anything else in a namespace is foreign: reported, skipped, never read, never fatal to publishing.

`sweep_engine_copies` removes what a killed engine left (the vLLM engine's packed copies,
`/dev/shm/liveloop-weights-<pid>-<uuid>`, whose process is gone).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from liveloop.transport.base import TransportUnavailable

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_CANDIDATES = 8
_ENGINE_COPY = re.compile(r"liveloop-weights-(\d+)-[0-9a-f]{32}")


class ForeignFile(OSError):
    """A file in a namespace that is not this user's own regular 0600 file (or not there at all)."""


@dataclass(frozen=True)
class Foreign:
    """Something in a namespace directory that is not ours (reported, never read)."""

    path: str
    why: str


def user_root(base: Path | None = None) -> Path:
    """This user's private directory under /dev/shm, made (0700) or checked; TransportUnavailable when
    every candidate name is taken by someone else."""
    base = SHM_DIR if base is None else base
    uid = os.getuid()
    for k in range(_CANDIDATES):
        path = base / (f"liveloop-{uid}" if k == 0 else f"liveloop-{uid}-{k}")
        why = _own_dir(path)
        if why is None:
            return path
        log.error("shared memory: %s is not ours (%s): using the next name", path, why)
    raise TransportUnavailable(f"shared memory: every private directory name under {base} is taken by another user")


def namespace_dir(namespace: str, base: Path | None = None) -> Path:
    """The deployment's directory, made (0700) or checked."""
    path = user_root(base) / namespace
    why = _own_dir(path)
    if why is not None:
        raise TransportUnavailable(f"shared memory: {path} cannot be made private ({why})")
    return path


def _own_dir(path: Path) -> str | None:
    """Make `path` a directory of ours with mode 0700; None if it is one now, else why not."""
    uid = os.getuid()
    for _ in range(3):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != uid:
            return f"owned by uid {st.st_uid}"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            log.warning("shared memory: %s is a %s of ours, not a directory: replacing it", path, "symlink" if stat.S_ISLNK(st.st_mode) else "file")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        if stat.S_IMODE(st.st_mode) != 0o700:
            log.warning("shared memory: %s had mode %o: narrowed to 0700", path, stat.S_IMODE(st.st_mode))
            os.chmod(path, 0o700, follow_symlinks=False)
        return None
    return "it keeps changing under us"


def check_file(fd: int, path: Path) -> os.stat_result:
    """fstat of an open file: ForeignFile unless it is a regular file of ours that only we can read."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ForeignFile(f"{path} is not a regular file")
    if st.st_uid != os.getuid():
        raise ForeignFile(f"{path} belongs to uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ForeignFile(f"{path} has mode {stat.S_IMODE(st.st_mode):o}")
    return st


def create(path: Path, size: int) -> mmap.mmap:
    """A new 0600 file of `size` bytes (never one that exists, never through a symlink), mapped shared."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, max(size, 1))
        return mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def open_mapped(path: Path) -> mmap.mmap:
    """An existing file of ours, mapped copy-on-write (our writes never reach it; its pages are shared
    until then). FileNotFoundError if it is not there, ForeignFile if it is not ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ForeignFile(f"{path}: {exc.strerror}") from None  # ELOOP: a symlink
    try:
        st = check_file(fd, path)
        if st.st_size == 0:
            raise ForeignFile(f"{path} is empty")
        return mmap.mmap(fd, st.st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def remove(path: Path) -> bool:
    """Remove `path` whatever it is (a directory planted under a name we need, too); whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)
    return True


def close(buf: mmap.mmap) -> None:
    try:
        buf.close()
    except BufferError:  # a tensor still views it: the mapping goes when that tensor does
        pass


def sweep_engine_copies(base: Path | None = None) -> list[str]:
    """Remove the engine copies (`liveloop-weights-<pid>-<uuid>`, ours) whose process is gone; their names."""
    base = SHM_DIR if base is None else base
    gone = []
    try:
        names = os.listdir(base)
    except OSError:
        return gone
    for name in names:
        m = _ENGINE_COPY.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            if os.lstat(base / name).st_uid != os.getuid():
                continue
            os.unlink(base / name)
            gone.append(name)
        except OSError:
            continue
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not ours, and its copies are not ours either
        return True
    return True
