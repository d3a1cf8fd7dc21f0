"""Weights are verified against the handle the version's row names before anything is yielded: a
tampered segment (the right name, other bytes), a manifest another attempt or process wrote, a
segment replaced by a symlink, a checkpoint whose files changed: each is WeightsUnverified, never
served. A handle that names no nonce and digest never opens memory (HandleGone: the durable checkpoint
is read instead). Foreign files in the namespace are reported and never stop a publish. Real /dev/shm
(a namespace of the test's own), real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from liveloop.transport import HandleGone, TransportConfig, WeightsUnverified, make_receiver, make_sender
from liveloop.transport import shared_memory as shm
from liveloop.transport.base import TensorDigest
from liveloop.transport.checkpoint_dir import verify_checkpoint


def weights(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(16, 8, generator=g) * scale
    return {"a": torch.randn(4, 5, generator=g) * scale, "embed.weight": emb, "lm_head.weight": emb, "b": torch.arange(6)}


def publish(namespace: str, version: int, state: dict[str, torch.Tensor]):
    sender = make_sender(TransportConfig(backend="shared_memory", namespace=namespace))
    sender.start_update(version)
    sender.send(state)
    return sender.finish()


def from_row(receiver, handle):
    """What the server rebuilds from the row the learner recorded (its nonce and digest)."""
    return receiver.handle_for(handle.version, nonce=handle.nonce, digest=handle.digest)


def test_the_handle_names_a_nonce_and_the_digest_of_the_tensors(namespace):
    state = weights()
    handle = publish(namespace, 1, state)
    assert len(handle.nonce) == 32 and len(handle.digest) == 64
    expected = TensorDigest()
    for name, t in state.items():  # names, dtypes, shapes and bytes, in the order sent
        expected.update(name, str(t.dtype).removeprefix("torch."), list(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    assert handle.digest == expected.hexdigest()
    assert publish(namespace, 2, state).nonce != handle.nonce  # one nonce per attempt
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    assert torch.equal(receiver.tensors(from_row(receiver, handle))["a"], state["a"])
    with receiver.open(from_row(receiver, handle)) as source:
        assert source.verified  # the engine need not scan them for non-finite values again


def test_a_tampered_segment_is_refused(namespace):
    handle = publish(namespace, 3, weights())
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    (data,) = [n for n in shm.segments(namespace)[3] if not n.endswith(".m")]
    path = shm.directory(namespace) / data
    with path.open("r+b") as f:  # the right name, other bytes (a same-user process wrote into it)
        f.seek(5)
        f.write(b"\x7f")
    with pytest.raises(WeightsUnverified, match="digest"):
        receiver.tensors(from_row(receiver, handle))


def test_a_version_replaced_under_its_name_is_refused(namespace):
    """The hostile tester's attack: another process writes a whole version under the predictable name."""
    handle = publish(namespace, 4, weights())
    publish(namespace, 4, weights(scale=100.0))  # a complete, well-formed version 4: not the row's
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    with pytest.raises(WeightsUnverified, match="nonce"):
        receiver.tensors(from_row(receiver, handle))


def test_a_segment_replaced_by_a_symlink_is_refused(namespace, tmp_path):
    handle = publish(namespace, 5, weights())
    (data,) = [n for n in shm.segments(namespace)[5] if not n.endswith(".m")]
    path = shm.directory(namespace) / data
    copy = tmp_path / "copy"
    copy.write_bytes(path.read_bytes())
    os.chmod(copy, 0o600)
    path.unlink()
    path.symlink_to(copy)
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    with pytest.raises(WeightsUnverified):
        receiver.tensors(from_row(receiver, handle))


def test_a_row_without_nonce_and_digest_never_opens_memory(namespace):
    publish(namespace, 6, weights())
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    with pytest.raises(HandleGone, match="no nonce and digest"):
        receiver.tensors(receiver.handle_for(6))


def test_foreign_files_are_reported_and_publishing_keeps_working(namespace):
    folder = shm.directory(namespace)
    (folder / "planted").write_bytes(b"x")  # not a name we make
    squat = folder / "v00000007.m"  # the next version's manifest name, 0644: not our own private file
    squat.write_bytes(b"LLWTMAN2garbage")
    os.chmod(squat, 0o644)
    found = shm.scan(namespace)
    assert sorted(Path(f.path).name for f in found.foreign) == ["planted", "v00000007.m"]
    handle = publish(namespace, 7, weights())  # its own name is taken back; nothing foreign is read
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    assert torch.equal(receiver.tensors(from_row(receiver, handle))["b"], torch.arange(6))
    removed, foreign = shm.sweep(namespace, servable=lambda v: True)
    assert removed == [] and [Path(f.path).name for f in foreign] == ["planted"]
    assert (folder / "planted").exists()  # reported, not touched


def test_start_sweep_removes_unfinished_and_unservable_versions(namespace):
    publish(namespace, 1, weights())
    publish(namespace, 2, weights())
    crashed = make_sender(TransportConfig(backend="shared_memory", namespace=namespace, keep_versions=5))
    crashed.start_update(3)
    crashed.send(weights())  # killed here: data, no manifest
    assert sorted(shm.segments(namespace)) == [1, 2, 3]
    removed, _ = shm.sweep(namespace, servable=lambda v: v == 2)  # 1 retired, 3 never finished
    assert removed == [1, 3] and sorted(shm.segments(namespace)) == [2]


def test_a_checkpoint_whose_files_changed_is_refused(tmp_path):
    sender = make_sender(TransportConfig(backend="checkpoint_dir"), path_for=lambda v: tmp_path / f"v{v}" / "policy")
    sender.start_update(1)
    sender.send(weights())
    handle = sender.finish()
    receiver = make_receiver(TransportConfig(backend="checkpoint_dir"))
    with receiver.open(handle):
        pass
    verify_checkpoint(handle.location, handle.digest)
    f = Path(handle.location) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(WeightsUnverified, match="hashes to"):
        with receiver.open(handle):
            pass
    verify_checkpoint(handle.location, None)  # the base model's row names no digest: read as it is


def test_a_large_state_hashes_on_threads_to_the_same_digest(monkeypatch):
    entries = [(f"t{i}", "float32", [1000], torch.full((1000,), float(i)).numpy().tobytes()) for i in range(6)]
    one = TensorDigest()
    for e in entries:
        one.update(*e)
    monkeypatch.setattr(TensorDigest, "PARALLEL_BYTES", 0)  # every state counts as large
    many = TensorDigest()
    many.update_many(entries)
    assert many.hexdigest() == one.hexdigest()
