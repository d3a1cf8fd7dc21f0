"""Where a deployment's weights sit in shared memory: a directory only this user can enter, never a
predictable name in /dev/shm that anyone may create first.

    /dev/shm/liveloop-<uid>/            0700, owned by us (checked with lstat: no symlink, our uid)
        <namespace>/                    0700, one per deployment (its random id, from the store)
            v00000007.m                 files: created O_EXCL | O_NOFOLLOW, 0600, then mmap'd
            v00000007.<nonce>.0000

A directory that is not ours is never used: a symlink we own is removed and made again, a mode
wider than 0700 narrowed; one another user planted (a symlink or a directory they own, which the
sticky /dev/shm will not let us remove) is reported and passed over for the next candidate name. The
candidates are the guessable `liveloop-<uid>`, `liveloop-<uid>-1` .. `-7`, then names no other user
can know before we make them, `liveloop-<uid>-<32 hex>`: sha256 of the uid, the namespace (by default
the store's random deployment id, which only the deployment's processes can read) and k = 0..15. Every
process of the deployment walks the same list, so they agree; a user who plants all eight guessable
names only moves us to the first unguessable one, and one who watches /dev/shm and plants that name
after a reboot moves us to the next. Where every candidate is taken, `TransportUnavailable`: the
deployment then falls back to checkpoint directories (`TransportConfig.for_deployment`). Files are
opened O_NOFOLLOW and checked with fstat (regular, our uid, no group/other bits); anything else in a
namespace is foreign: reported, skipped, never read, never fatal to publishing.

`sweep_engine_copies` removes what a killed engine left (the vLLM engine's packed copies,
`/dev/shm/liveloop-weights-<pid>-<uuid>`, whose process is gone).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from liveloop.transport.errors import TransportUnavailable

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_GUESSABLE = 8  # liveloop-<uid>, liveloop-<uid>-1 .. -7
_UNGUESSABLE = 16  # liveloop-<uid>-<sha256 of uid, namespace, k>[:32], k < 16
_ENGINE_COPY = re.compile(r"liveloop-weights-(\d+)-[0-9a-f]{32}")


class ForeignFile(OSError):
    """A file in a namespace that is not this user's own regular 0600 file (or not there at all)."""


@dataclass(frozen=True)
class Foreign:
    """Something in a namespace directory that is not ours (reported, never read)."""

    path: str
    why: str


def candidates(base: Path, namespace: str | None = None) -> list[Path]:
    """The names this user's private directory may have under `base`, in the order every process walks
    them: the guessable ones, then (given the namespace) the ones derived from it."""
    uid = os.getuid()
    names = [f"liveloop-{uid}" if k == 0 else f"liveloop-{uid}-{k}" for k in range(_GUESSABLE)]
    if namespace is not None:
        names += [f"liveloop-{uid}-{_unguessable(uid, namespace, k)}" for k in range(_UNGUESSABLE)]
    return [base / name for name in names]


def _unguessable(uid: int, namespace: str, k: int) -> str:
    return hashlib.sha256(f"liveloop shared memory\0{uid}\0{namespace}\0{k}".encode()).hexdigest()[:32]


def user_root(base: Path | None = None, namespace: str | None = None) -> Path:
    """This user's private directory under /dev/shm (for `namespace`'s deployment: its unguessable names
    too), made (0700) or checked; TransportUnavailable when every candidate name is taken by someone else."""
    base = SHM_DIR if base is None else base
    for path in candidates(base, namespace):
        why = _own_dir(path)
        if why is None:
            return path
        _report_once(path, why)
    raise TransportUnavailable(f"shared memory: every private directory name under {base} is taken by another user")


_reported: set[tuple[Path, str]] = set()


def _report_once(path: Path, why: str) -> None:
    """Log a name someone else took, once per process (every look at the directory walks the names)."""
    if (path, why) not in _reported:
        _reported.add((path, why))
        log.error("shared memory: %s is not ours (%s): using the next name", path, why)


def namespace_dir(namespace: str, base: Path | None = None) -> Path:
    """The deployment's directory, made (0700) or checked."""
    path = user_root(base, namespace) / namespace
    why = _own_dir(path)
    if why is not None:
        raise TransportUnavailable(f"shared memory: {path} cannot be made private ({why})")
    return path


def namespace_unavailable(namespace: str) -> str | None:
    """Why the namespace's private directory cannot be had on this machine (every name under /dev/shm
    taken by another user, no /dev/shm); None when it can (it is made now, so later looks find it ours)."""
    try:
        namespace_dir(namespace)
    except TransportUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"shared memory: {exc}"
    return None


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
    return open_mapped_stat(path)[0]


def open_mapped_stat(path: Path) -> tuple[mmap.mmap, os.stat_result]:
    """`open_mapped`, with the fstat of the file that was mapped (its device and inode name exactly the
    bytes mapped: another process can map the same file and check it is the one)."""
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
        return mmap.mmap(fd, st.st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE), st
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
