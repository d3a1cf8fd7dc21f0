"""Checkpoint directories shared by the learner and the server: content digests and atomic saves."""

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


def save_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp_dir)` and rename the result to `final`: a reader never sees half a checkpoint."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    write(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final
