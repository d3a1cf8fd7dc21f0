"""Private by default: what liveloop keeps at rest (the store and its SQLite side files, exports, logs)
is readable and writable by the user that runs it and by no other local account.

Three parts:
  - `restrict_umask()`: umask 077 for a liveloop process (the CLI calls it first), so whatever it and
    the processes it starts (Ray's raylet and workers inherit it) create is 0600 / 0700 unless chosen.
  - helpers that choose the mode whatever the umask: `private_dir` (each directory it makes is 0700),
    `create_private` (a fresh 0600 file: O_EXCL | O_NOFOLLOW, never an existing file or a symlink),
    `private_temp` (an unpredictable 0600 temporary file beside a destination, for write-then-rename),
    `tighten` (an existing file or directory of ours narrowed to the owner's bits).
  - `check_data(config)`: the start-time check of `liveloop serve`. A data path (the SQLite store's
    directory, its files, the checkpoint directories) that other users can read or write is narrowed
    to the owner's bits with a loud warning when it is ours to change; it is refused (`NotPrivate`,
    naming the path and the fix) when it is not: another user's, or a shared sticky directory like
    /tmp that must never be chmodded.
This module knows nothing of what the files hold, only where a config keeps them (`data_paths`)."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

UMASK = 0o077
OTHERS = 0o077  # the group and other permission bits
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # what SQLite keeps beside a database file


class NotPrivate(ValueError):
    """A data path other users can read or write that liveloop must not change itself."""


def restrict_umask() -> int:
    """Set this process's umask to 077 (inherited by every process it starts); returns the old one."""
    return os.umask(UMASK)


def private_dir(path: str | Path) -> Path:
    """`path` as a directory, each missing directory on the way made 0700 (existing ones are left as
    they are: `check_data` judges them)."""
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue  # made by another process meanwhile: judged like any existing directory
        os.chmod(p, 0o700)  # whatever the umask
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is not a directory")
    return path


def create_private(path: str | Path) -> int:
    """A new, empty 0600 file at `path` opened for writing (FileExistsError if anything is there, a
    symlink included); returns its descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def private_temp(dest: str | Path) -> tuple[int, Path]:
    """An unpredictable, exclusively created 0600 file in `dest`'s directory (for writing `dest` under
    a temporary name and `os.replace`-ing it there): its descriptor and path."""
    dest = Path(dest)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    os.fchmod(fd, 0o600)
    return fd, Path(name)


def tighten(path: str | Path) -> bool:
    """Clear the group and other bits of an existing file or directory of ours (never through a
    symlink); whether it changed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or not stat.S_IMODE(st.st_mode) & OTHERS:
        return False
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~OTHERS, follow_symlinks=False)
    return True


def check_private(paths: Iterable[str | Path]) -> list[Path]:
    """Each existing path in `paths` private (no group/other bits), narrowed with a warning where it is
    ours; NotPrivate where it is not ours to narrow. Returns the paths narrowed."""
    narrowed = []
    for path in dict.fromkeys(Path(p) for p in paths):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not mode & OTHERS:
            continue
        fix = f"chmod {'700' if stat.S_ISDIR(st.st_mode) else '600'} {path}"
        if st.st_uid != os.geteuid():
            raise NotPrivate(f"{path} (mode {mode:04o}, owner uid {st.st_uid}) can be read or written by other users and is "
                             f"not ours: keep liveloop's data in a directory of its own user: chown it and `{fix}`")
        if mode & stat.S_ISVTX or (stat.S_ISDIR(st.st_mode) and mode & 0o002):
            raise NotPrivate(f"{path} (mode {mode:04o}) is a directory every user can write (like /tmp): put liveloop's "
                             f"data in a directory of its own (`mkdir -m 700 ...`), not here")
        os.chmod(path, mode & ~OTHERS)
        log.warning("PRIVATE DATA WAS EXPOSED: %s had mode %04o (other users could read or write it); narrowed to %04o. "
                    "Check who read it; liveloop keeps its data private from now on (`%s`)", path, mode, mode & ~OTHERS, fix)
        narrowed.append(path)
    return narrowed


def sqlite_files(url: str) -> list[Path]:
    """A SQLite URL's database file and its side files (the database first); [] for another database
    or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return []
    db = Path(parsed.database)
    return [db, *(db.with_name(db.name + suffix) for suffix in SQLITE_SIDE_FILES)]


def data_paths(config: Any) -> list[Path]:
    """What `check_data` looks at: the SQLite store's directory and files (PostgreSQL keeps its own),
    and the configured checkpoint directories."""
    files = sqlite_files(config.store.url)
    paths = [files[0].parent, *files] if files else []
    for section in ("learner", "engine"):
        directory = getattr(getattr(config, section, None), "checkpoint_dir", None)
        if directory:
            paths.append(Path(directory))
    return paths


def check_data(config: Any) -> list[Path]:
    """The start-time check of the data a deployment keeps (`check_private` over `data_paths`)."""
    return check_private(data_paths(config))
