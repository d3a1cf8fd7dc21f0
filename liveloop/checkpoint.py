"""Checkpoint directories shared by the learner and the server: content digests and atomic, durable
saves (the files and the directory fsynced before the rename, the parent after it: a version row that
names a checkpoint is written only once the checkpoint would survive a power loss)."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path


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
