"""The delta backend on the tiny model (models/liveloop-tiny, tied embeddings) trained the way the learner
trains it (SAO's policy loss, AdamW at the learner's learning rate, fp32 master weights under bfloat16):
every version rebuilt from the chain is byte-identical to the full checkpoint the checkpoint_dir backend
writes of the same state, tensor by tensor, and its digest is the one computed from that checkpoint; a
receiver several versions behind catches up through the chain. Through server/control/activator.py and the real
hf engine: versions activate from their deltas; a version whose delta was changed never serves from it
(its durable checkpoint serves, verified against the row), and one that cannot be rebuilt and has no
durable checkpoint yet waits while the old version keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from liveloop.metrics import Metrics
from liveloop.server.control.activator import Activator
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, byte_view, make_receiver, make_sender
from liveloop.transport import delta as dt
from liveloop.transport.base import TensorDigest
from liveloop.transport.shared_memory import dtype_name
from liveloop.rl.losses import sao_policy_loss
from liveloop.rl.optim import make_optimizer

LR = 2e-4  # the learner's default learning_rate


def learner_step(model: torch.nn.Module, opt, g: torch.Generator) -> None:
    """One SAO policy step on a batch of sampled-looking tokens rated up or down."""
    ids = torch.randint(5, model.config.vocab_size, (4, 12), generator=g)
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    advantages = (torch.randint(0, 2, (4, 1), generator=g).float() * 2 - 1).expand_as(logp)
    loss, _ = sao_policy_loss(logp, logp.detach(), advantages, torch.ones_like(logp), 0.3, 5.0)
    assert opt.step(loss) is not None


def digest_of(state: dict[str, torch.Tensor], names: list[str]) -> str:
    d = TensorDigest()
    for name in names:
        t = state[name]
        d.update(name, dtype_name(t.dtype), list(t.shape), byte_view(t).numpy())
    return d.hexdigest()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chain_is_byte_identical_to_the_full_checkpoint(model_dir, tmp_path, dtype):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    opt = make_optimizer(model, LR, 1.0)
    g = torch.Generator().manual_seed(1)
    config = TransportConfig(backend="delta", delta_dir=str(tmp_path / "deltas"), delta_max_chain=3)
    sender, follower = make_sender(config), make_receiver(config)
    full = make_sender(TransportConfig(), path_for=lambda v: tmp_path / f"v{v:06d}" / "policy", base_model=model_dir)
    checkpoints = make_receiver(TransportConfig())
    handles, durables = [], []
    for version in range(1, 7):
        learner_step(model, opt, g)
        state = model.state_dict()
        for s in (sender, full):
            s.start_update(version)
            s.send(state)
        handles.append(sender.finish())
        durables.append(full.finish())
        names = list(state)
        expected = checkpoints.tensors(durables[-1])  # the full checkpoint, read back from disk
        rebuilt = follower.tensors(handles[-1])
        assert sorted(rebuilt) == sorted(expected) == sorted(names)
        for name in names:
            assert rebuilt[name].dtype == expected[name].dtype == dtype and rebuilt[name].shape == expected[name].shape
            assert torch.equal(byte_view(rebuilt[name]), byte_view(expected[name])), name
        assert handles[-1].digest == digest_of(expected, names) == digest_of(rebuilt, names)
        if version > 1 and handles[-1].detail["kind"] == "delta":
            assert follower.last_route.base == version - 1
    assert [h.detail["kind"] for h in handles][:2] == ["full", "delta"]
    # several versions behind: a receiver holding version 2 reaches 4 through 3 and 4's deltas
    behind = make_receiver(config)
    behind.rebuild(handles[1])
    behind.rebuild(handles[3])
    assert behind.last_route.base == 2 and [d["version"] for d in behind.last_route.steps] == [3, 4]
    fresh = make_receiver(config)
    final = fresh.tensors(handles[-1])
    assert all(torch.equal(byte_view(final[k]), byte_view(v)) for k, v in model.state_dict().items())


def _record(store, handle, version: int, parent: int, durable=None, path: Path | None = None) -> None:
    store.versions.add_version(
        version, parent=parent, checkpoint_path=durable.location if durable else str(path), status=VersionStatus.PUBLISHED,
        checkpoint_sha256=durable.digest if durable else None, weights_nonce=handle.nonce, weights_digest=handle.digest,
    )


def _serves(engine, state: dict[str, torch.Tensor]) -> bool:
    own = engine.model.state_dict()
    return all(torch.equal(byte_view(own[k]), byte_view(v)) for k, v in state.items())


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_publisher_activates_deltas_and_never_serves_a_changed_one(engine, store, model_dir, tmp_path):
    config = TransportConfig(backend="delta", delta_dir=str(tmp_path / "deltas"))
    receiver = make_receiver(config)
    activator = Activator(engine, store.versions, store.operator, Metrics(), receiver=receiver)
    sender = make_sender(config)
    writer = make_sender(TransportConfig(), path_for=lambda v: tmp_path / f"v{v:06d}" / "policy", base_model=model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=engine.model.dtype)
    opt = make_optimizer(model, LR, 1.0)
    g = torch.Generator().manual_seed(2)

    def publish(version: int, durable: bool = False):
        learner_step(model, opt, g)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        sender.start_update(version)
        sender.send(model.state_dict())
        handle = sender.finish()
        written = None
        if durable:
            writer.start_update(version)
            writer.send(state)
            written = writer.finish()
        _record(store, handle, version, version - 1, written, tmp_path / f"v{version:06d}" / "policy")
        return handle, state

    for version in (1, 2):
        handle, state = publish(version)
        assert (await activator.activate(store.versions.get_version(version))).version == version
        assert activator.last_swap_via == "delta" and _serves(engine, state)
    assert handle.detail["kind"] == "delta" and receiver.last_route.base == 1

    # version 3's delta is changed after it was written: its durable checkpoint serves instead
    handle, state = publish(3, durable=True)
    doc = json.loads(dt.manifest_path(dt.directory(config), 3).read_text())
    f = dt.directory(config) / doc["file"]
    data = bytearray(f.read_bytes())
    data[-2] ^= 0x10
    f.write_bytes(bytes(data))
    assert (await activator.activate(store.versions.get_version(3))).version == 3
    assert activator.last_swap_via == "checkpoint_dir" and _serves(engine, state) and receiver.holds == 2

    # version 4 is a delta on the changed one, with no durable checkpoint yet: it waits, 3 keeps serving
    publish(4)
    assert await activator.activate(store.versions.get_version(4)) is None
    assert engine.version == 3 and _serves(engine, state) and store.versions.get_version(4).status == VersionStatus.PUBLISHED
