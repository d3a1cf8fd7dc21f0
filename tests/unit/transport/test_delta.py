"""The delta backend on small states of every dtype: chunks found and written back bit for bit; a chain
of versions (full copies every `delta_max_chain`, deltas between) rebuilt byte-identical with the digest
its handle names, by a receiver following every version, one several versions behind and one starting
fresh; what a receiver must never serve (a changed data file, one whose manifest was rewritten to
match, another attempt's manifest, a broken chain) raises DeltaUnusable, a HandleGone, and leaves its
state as it was; a sender that dies mid-write leaves nothing a receiver reads, and the next sender's
init clears it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from liveloop.transport import HandleGone, TransportConfig, WeightHandle, byte_view, make_receiver, make_sender
from liveloop.transport import delta as dt
from liveloop.transport.base import TensorDigest
from liveloop.transport.shared_memory import dtype_name


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(64, 40, generator=g)
    return {
        "f32": torch.randn(50, 33, generator=g),
        "bf16": torch.randn(70, 31, generator=g).to(torch.bfloat16),
        "f16": torch.randn(13, generator=g).to(torch.float16),
        "i64": torch.arange(-5, 5),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(5, 3, generator=g).t(),  # non-contiguous input
        "embed.weight": emb,
        "lm_head.weight": emb,  # tied: the same memory under two names
    }


def step(state: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """A learner-like update: a few elements of the float tensors move a little (the tie kept)."""
    g = torch.Generator().manual_seed(100 + k)
    out = {}
    for name, t in state.items():
        if name == "lm_head.weight":
            out[name] = out["embed.weight"]
        elif t.is_floating_point() and t.numel() > 1:
            flat = t.detach().clone().reshape(-1)
            idx = torch.randint(0, flat.numel(), (3,), generator=g)
            flat[idx] = flat[idx] + 0.25
            out[name] = flat.view(t.shape)
        else:
            out[name] = t.clone()
    return out


def digest_of(state: dict[str, torch.Tensor]) -> str:
    d = TensorDigest()
    for name, t in state.items():
        d.update(name, dtype_name(t.dtype), list(t.shape), byte_view(t).numpy())
    return d.hexdigest()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(byte_view(a[k]), byte_view(b[k])) for k in a
    )


def publish(sender, version: int, state: dict[str, torch.Tensor]) -> WeightHandle:
    sender.start_update(version)
    sender.send(state)
    return sender.finish()


@pytest.fixture
def config(tmp_path: Path) -> TransportConfig:
    return TransportConfig(backend="delta", delta_dir=str(tmp_path / "deltas"), delta_max_chain=3, delta_chunk_bytes=64)


def chain(config: TransportConfig, n: int) -> tuple[list[dict[str, torch.Tensor]], list[WeightHandle]]:
    sender = make_sender(config)
    states, handles = [weights()], []
    for v in range(1, n + 1):
        if v > 1:
            states.append(step(states[-1], v))
        handles.append(publish(sender, v, states[-1]))
    return states, handles


@pytest.mark.parametrize("nbytes", [64 * 5, 64 * 5 + 3, 7, 1])
def test_diff_and_apply_are_exact(nbytes):
    g = torch.Generator().manual_seed(nbytes)
    old = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    new = old.clone()
    for i in (0, nbytes - 1, nbytes // 2):
        new[i] ^= 0x5A
    idx, data = dt.diff(old, new, 64)
    assert torch.equal(dt.apply(old, idx, data, 64), new)
    assert idx.numel() <= 3 and data.numel() <= 3 * 64
    none_idx, none_data = dt.diff(old, old, 64)
    assert none_idx.numel() == 0 and none_data.numel() == 0


def test_apply_refuses_chunks_that_do_not_fit():
    base = torch.zeros(200, dtype=torch.uint8)
    with pytest.raises(ValueError):
        dt.apply(base, torch.tensor([7]), torch.zeros(64, dtype=torch.uint8), 64)  # no chunk 7
    with pytest.raises(ValueError):
        dt.apply(base, torch.tensor([0]), torch.zeros(63, dtype=torch.uint8), 64)  # short data
    with pytest.raises(ValueError):
        dt.apply(base, torch.tensor([-1]), torch.zeros(64, dtype=torch.uint8), 64)


def test_a_chain_rebuilds_every_version_bit_for_bit(config):
    receiver = make_receiver(config)
    sender = make_sender(config)
    states = [weights()]
    kinds = []
    for v in range(1, 9):
        if v > 1:
            states.append(step(states[-1], v))
        handle = publish(sender, v, states[-1])
        kinds.append(handle.detail["kind"])
        assert handle.digest == digest_of(states[-1])
        with receiver.open(handle) as source:
            assert source.verified and same(dict(source.tensors), {k: v.contiguous() for k, v in states[-1].items()})
        if handle.detail["kind"] == "delta":
            assert handle.detail["parent"] == v - 1 and receiver.last_route.base == v - 1
            assert 0 < handle.detail["bytes"] < handle.detail["full_bytes"] // 4
            assert handle.detail["changed"] == 5  # the float tensors but the scalar (the tie counted once)
    # a full copy every delta_max_chain deltas
    assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta"]
    assert sender.stats.versions == 8 and sender.stats.full_copies == 2 and sender.stats.bytes_sent < sender.stats.full_bytes
    manifest = json.loads(dt.manifest_path(dt.directory(config), 6).read_text())
    assert manifest["parent"] == 5 and manifest["changed"] == ["f32", "bf16", "f16", "transposed", "embed.weight"]
    assert manifest["bytes"] == os.path.getsize(dt.directory(config) / manifest["file"])


def test_receivers_behind_or_fresh_catch_up(config):
    states, handles = chain(config, 7)
    behind = make_receiver(config)
    with behind.open(handles[1]):  # holds version 2
        pass
    state = behind.rebuild(handles[3])  # 2 -> 3 -> 4 through the chain, not from the full copy
    assert behind.last_route.base == 2 and [d["version"] for d in behind.last_route.steps] == [3, 4]
    assert same(state.tensors(), {k: v.contiguous() for k, v in states[3].items()})
    fresh = make_receiver(config)
    assert same(fresh.tensors(handles[6]), {k: v.contiguous() for k, v in states[6].items()})
    assert fresh.last_route.base is None and [d["version"] for d in fresh.last_route.steps] == [5, 6, 7]
    # a receiver whose version is before the last full copy starts from that copy
    assert behind.rebuild(handles[6]).version == 7 and behind.last_route.base is None


def _tamper(config: TransportConfig, version: int, fix_manifest: bool) -> None:
    path = dt.manifest_path(dt.directory(config), version)
    doc = json.loads(path.read_text())
    f = dt.directory(config) / doc["file"]
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x01  # a bit of the last tensor's bytes
    f.write_bytes(bytes(data))
    if fix_manifest:  # whoever changed the file rewrote its manifest's sha256 too: the state's digest still catches it
        doc["file_sha256"] = hashlib.sha256(bytes(data)).hexdigest()
        path.write_text(json.dumps(doc))


@pytest.mark.parametrize("fix_manifest", [False, True])
def test_a_changed_delta_never_serves(config, fix_manifest):
    states, handles = chain(config, 3)
    receiver = make_receiver(config)
    receiver.rebuild(handles[1])
    _tamper(config, 3, fix_manifest)
    with pytest.raises(dt.DeltaUnusable) as err:
        with receiver.open(handles[2]):
            pytest.fail("a changed delta was yielded")
    assert isinstance(err.value, HandleGone)  # the publisher reads the durable checkpoint instead
    assert ("digest" if fix_manifest else "sha256") in str(err.value)
    assert receiver.holds == 2  # its state is the verified version 2's, untouched
    assert same(receiver.tensors(handles[1]), {k: v.contiguous() for k, v in states[1].items()})


def test_a_manifest_or_row_of_another_attempt_never_serves(config):
    states, handles = chain(config, 2)
    receiver = make_receiver(config)
    for wrong in (
        WeightHandle("delta", 2, handles[1].location, nonce="0" * 32, digest=handles[1].digest),
        WeightHandle("delta", 2, handles[1].location, nonce=handles[1].nonce, digest="0" * 64),
    ):
        with pytest.raises(dt.DeltaUnusable):
            receiver.rebuild(wrong)
    with pytest.raises(HandleGone):  # a row from before digests: nothing to verify against
        receiver.rebuild(WeightHandle("delta", 2, handles[1].location))
    assert receiver.holds is None


def test_a_broken_chain_with_no_full_copy_is_unusable(config):
    states, handles = chain(config, 4)
    receiver = make_receiver(config)
    receiver.rebuild(handles[0])
    dt.manifest_path(dt.directory(config), 2).unlink()
    with pytest.raises(dt.DeltaUnusable):
        receiver.rebuild(handles[3])
    receiver.rebuild(handles[0])  # what it holds still serves
    with pytest.raises(dt.DeltaUnusable):
        make_receiver(config).rebuild(handles[3])


def test_release_and_abort_leave_no_chain_through_them(config):
    sender = make_sender(config)
    s1 = weights()
    publish(sender, 1, s1)
    publish(sender, 2, step(s1, 2))
    sender.release(2)  # its row was refused: version 3 must not be written against it
    assert dt.versions(dt.directory(config)) == [1]
    h3 = publish(sender, 3, step(s1, 3))
    assert h3.detail["kind"] == "full"
    sender.start_update(4)
    sender.send(step(s1, 4))
    sender.abort()
    assert dt.versions(dt.directory(config)) == [1, 3] and not [n for n in os.listdir(dt.directory(config)) if n.startswith(".")]
    h5 = publish(sender, 5, step(step(s1, 3), 5))
    assert h5.detail["kind"] == "delta" and h5.detail["parent"] == 3


# a sender process that dies (no cleanup, no finally: os._exit) when it reaches version 2's manifest,
# after its data file is in place; with `before_rename` half of the manifest is under its temporary name
_DIE_MID_WRITE = """
import os, sys, torch
from liveloop.transport import delta as dt
directory, before_rename = sys.argv[1], sys.argv[2] == "1"
sender = dt.DeltaSender(directory, 3, 64)
state = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(300, dtype=torch.bfloat16)}
sender.start_update(1); sender.send(state); sender.finish()
write = sender._write
def dying(name, fn):
    if name.endswith(".json"):
        if before_rename:
            (sender.directory / f".{name}.tmp-{os.getpid()}").write_bytes(b'{"format": "liveloop-de')
        os._exit(3)
    write(name, fn)
sender._write = dying
state["w"][7] += 1
sender.start_update(2); sender.send(state); sender.finish()
"""


def test_a_sender_dying_mid_write_leaves_nothing_a_receiver_reads(config):
    proc = subprocess.run([sys.executable, "-c", _DIE_MID_WRITE, str(dt.directory(config)), "1"], timeout=120)
    assert proc.returncode == 3
    left = sorted(os.listdir(dt.directory(config)))
    assert any(n.startswith("v00000002.") and n.endswith(".safetensors") for n in left)  # its data made it, its manifest not
    assert any(n.startswith(".v00000002.json.tmp-") for n in left)
    receiver = make_receiver(config)
    with pytest.raises(HandleGone):
        receiver.rebuild(WeightHandle("delta", 2, str(dt.manifest_path(dt.directory(config), 2)), nonce="a" * 32, digest="b" * 64))
    sender = make_sender(config)
    sender.init()  # what the dead sender left goes
    assert sorted(os.listdir(dt.directory(config))) == [n for n in left if n.startswith("v00000001.")]
    state = step(weights(), 7)
    handle = publish(sender, 2, state)
    assert handle.detail["kind"] == "full"  # a new sender knows no previous state
    assert same(receiver.tensors(handle), {k: v.contiguous() for k, v in state.items()})


def test_config_needs_a_directory():
    with pytest.raises(ValueError, match="delta_dir"):
        TransportConfig(backend="delta")
    with pytest.raises(ValueError, match="delta_chunk_bytes"):
        TransportConfig(backend="delta", delta_dir="/x", delta_chunk_bytes=100)
    with pytest.raises(ValueError, match="delta_max_chain"):
        TransportConfig(backend="delta", delta_dir="/x", delta_max_chain=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_small_changes_travel_as_compressed_xor(dtype):
    g = torch.Generator().manual_seed(3)
    old = (torch.randn(4096, generator=g) * 0.02).to(dtype)
    new = (old.float() - 2e-4 * torch.randn(4096, generator=g).sign()).to(dtype)  # an AdamW-sized step everywhere
    a, b = byte_view(old).clone(), byte_view(new).clone()
    parts = dt.encode(a, b, old.element_size(), 4096)
    assert set(parts) == {"xor"} and parts["xor"].numel() < b.numel() * 0.8
    assert torch.equal(dt.xor_decode(a, parts["xor"], old.element_size()), b)
    with pytest.raises(ValueError):  # a packed entry that unpacks to more than the tensor is refused
        dt.xor_decode(a[:-4], parts["xor"], old.element_size())


def test_deployments_sharing_a_directory_keep_their_own_versions(tmp_path):
    configs = [TransportConfig(backend="delta", delta_dir=str(tmp_path), namespace=ns) for ns in ("dA", "dB")]
    states = [weights(1), weights(2)]
    handles = [publish(make_sender(c), 1, s) for c, s in zip(configs, states)]
    for c, s, h in zip(configs, states, handles):
        assert same(make_receiver(c).tensors(h), {k: v.contiguous() for k, v in s.items()})
    assert dt.directory(configs[0]) != dt.directory(configs[1])
