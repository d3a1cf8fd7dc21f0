"""`save_atomically` (liveloop/checkpoint.py) makes a checkpoint durable before anyone may name it: every
file and directory it wrote is fsynced before the rename, the parent after it (what each fsync hit is
read back from /proc/self/fd)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def test_a_write_that_fails_leaves_nothing_behind(tmp_path):
    """save_atomically: a writer that fails half-way (a full disk, a model that will not serialise) leaves
    neither the checkpoint nor its temporary directory."""
    from liveloop.checkpoint import save_atomically

    def write(tmp):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        save_atomically(tmp_path / "model", write)
    assert list(tmp_path.iterdir()) == []


def test_file_sha256_is_the_bytes_digest(tmp_path):
    import hashlib

    from liveloop.checkpoint import file_sha256

    data = bytes(range(256)) * 9000  # over one read block
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
