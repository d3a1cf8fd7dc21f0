"""What a checkpoint's digest covers (liveloop/checkpoint.py) and how a checkpoint is read verified
(liveloop/transport/checkpoint_dir.py): the `sha256-all` digest every writer records covers every file
(config, generation config, tokenizer, names), a row of the old kind (bare hex, safetensors only) is
still checked as it was, and `verified_copy` hands on a private copy of the bytes it hashed, so a file
changed afterwards is not what loads. Saved checkpoints are 0700."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest

from liveloop.checkpoint import CheckpointEntryRefused, checkpoint_digest, legacy_digest, save_atomically
from liveloop.transport import WeightsUnverified
from liveloop.transport.checkpoint_dir import sweep_stale_copies, verified_copy, verify_checkpoint

FILES = {
    "model.safetensors": b"weights",
    "config.json": json.dumps({"num_attention_heads": 4, "rope_theta": 10000.0}).encode(),
    "generation_config.json": b'{"temperature": 1.0}',
    "tokenizer.json": b'{"model": {"vocab": {}}}',
}


def checkpoint(root: Path, files: dict[str, bytes] = FILES) -> Path:
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def test_the_digest_covers_every_file_and_its_name(tmp_path):
    digest = checkpoint_digest(checkpoint(tmp_path / "a"))
    assert digest.startswith("sha256-all:") and len(digest) <= 64  # it fits the store's column
    assert checkpoint_digest(checkpoint(tmp_path / "same")) == digest  # names and contents, not where
    changes = {
        "config": FILES | {"config.json": FILES["config.json"].replace(b"4", b"2")},
        "generation": FILES | {"generation_config.json": b'{"temperature": 0.1}'},
        "tokenizer": FILES | {"tokenizer.json": b"{}"},
        "added": FILES | {"special_tokens_map.json": b"{}"},
        "removed": {k: v for k, v in FILES.items() if k != "tokenizer.json"},
        "renamed": {("vocab.json" if k == "tokenizer.json" else k): v for k, v in FILES.items()},
        "moved bytes": FILES | {"model.safetensors": b"weight", "config.json": b"s" + FILES["config.json"]},
    }
    for why, files in changes.items():
        assert checkpoint_digest(checkpoint(tmp_path / why, files)) != digest, why
    # the build's own record (which names the digest) is the one file left out
    (tmp_path / "a" / "liveloop_build.json").write_text("{}")
    assert checkpoint_digest(tmp_path / "a") == digest


def test_a_symlink_has_no_digest(tmp_path):
    root = checkpoint(tmp_path / "a")
    (root / "tokenizer.json").unlink()
    (root / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(CheckpointEntryRefused):
        checkpoint_digest(root)
    with pytest.raises(WeightsUnverified):
        verified_copy(root, checkpoint_digest(checkpoint(tmp_path / "b")))


def test_a_changed_config_fails_verification(tmp_path):
    root = checkpoint(tmp_path / "a")
    digest = checkpoint_digest(root)
    verify_checkpoint(root, digest, 1)
    (root / "config.json").write_text(json.dumps({"num_attention_heads": 2, "rope_theta": 10000.0}))
    with pytest.raises(WeightsUnverified, match="hashes to"):
        verify_checkpoint(root, digest, 1)
    with pytest.raises(WeightsUnverified, match="hashes to"):
        verified_copy(root, digest, 1)
    assert not list(Path(tempfile.gettempdir()).glob(f"liveloop-verified-{os.getpid()}-*"))  # no copy left


def test_an_old_row_is_checked_as_it_was_written(tmp_path):
    """A bare hex digest is the old kind: the safetensors bytes, in name order, and nothing else."""
    root = checkpoint(tmp_path / "a", FILES | {"model-00002.safetensors": b"more"})
    old = hashlib.sha256(b"more" + b"weights").hexdigest()  # the old checkpoint_digest's ("-" sorts before ".")
    assert legacy_digest(root) == old
    verify_checkpoint(root, old, 1)
    (root / "config.json").write_text("{}")  # not covered by an old digest: documented, still verifies
    with verified_copy(root, old, 1) as copy:
        assert (copy.path / "config.json").read_text() == "{}"
    (root / "model.safetensors").write_bytes(b"changed")
    with pytest.raises(WeightsUnverified):
        verify_checkpoint(root, old, 1)
    with pytest.raises(WeightsUnverified, match="no known kind"):
        verify_checkpoint(root, "md5:abc", 1)


def test_the_copy_is_private_holds_what_was_hashed_and_goes(tmp_path):
    root = checkpoint(tmp_path / "a")
    digest = checkpoint_digest(root)
    with verified_copy(root, digest, 1) as copy:
        assert copy.path.stat().st_mode & 0o777 == 0o700 and copy.path.parent != root.parent
        for name in FILES:  # the shared files change after hashing: the copy does not
            (root / name).write_bytes(b"someone else's")
        assert {f.name: f.read_bytes() for f in copy.path.iterdir()} == FILES
        assert checkpoint_digest(copy.path) == digest
    assert not copy.path.exists()
    assert verified_copy(root, None).path == root  # no digest (the base model): read in place, never removed
    assert root.exists()


def test_copies_of_dead_processes_are_swept(tmp_path):
    dead = tmp_path / "liveloop-verified-999999999-x"  # no such pid
    live = tmp_path / f"liveloop-verified-{os.getpid()}-y"
    dead.mkdir()
    live.mkdir()
    assert sweep_stale_copies(tmp_path) == [dead]
    assert not dead.exists() and live.exists()


def test_saved_checkpoints_are_private(tmp_path):
    def write(tmp: Path) -> None:
        (tmp / "policy").mkdir(parents=True)
        (tmp / "policy" / "model.safetensors").write_bytes(b"weights")

    final = save_atomically(tmp_path / "v000001", write)
    assert final.stat().st_mode & 0o777 == 0o700 and (final / "policy").stat().st_mode & 0o777 == 0o700
