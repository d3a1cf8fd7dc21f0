"""`save_atomically` (liveloop/checkpoint.py) makes a checkpoint durable before anyone may name it: every
file and directory it wrote is fsynced before the rename, the parent after it (what each fsync hit is
read back from /proc/self/fd)."""

from __future__ import annotations

import os
from pathlib import Path

from liveloop.checkpoint import checkpoint_digest, save_atomically


def test_files_and_directories_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def write(tmp: Path) -> None:
        (tmp / "policy").mkdir(parents=True)
        (tmp / "policy" / "model.safetensors").write_bytes(b"weights")
        (tmp / "policy" / "config.json").write_text("{}")

    monkeypatch.setattr(os, "fsync", recording_fsync)
    final = save_atomically(tmp_path / "v000001", write)

    tmp = str(tmp_path / f".v000001.tmp-{os.getpid()}")
    assert {tmp, tmp + "/policy", tmp + "/policy/model.safetensors", tmp + "/policy/config.json"} <= set(synced[:-1])
    assert synced.index(tmp + "/policy/model.safetensors") < synced.index(tmp + "/policy") < synced.index(tmp)  # files, then their directories
    assert synced[-1] == str(tmp_path)  # the rename itself, last
    assert (final / "policy" / "model.safetensors").read_bytes() == b"weights"
    assert checkpoint_digest(final / "policy")
