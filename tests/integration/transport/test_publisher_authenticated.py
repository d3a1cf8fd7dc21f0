"""The activator verifies weights against their row before they serve, on a real hf engine
(models/liveloop-tiny) and a real store: a version whose memory was tampered with (right name, wrong
bytes) or replaced (another complete version under its name) never swaps in; the version serving keeps
serving, the row becomes FAILED with a "weights_rejected" event and `server/weights_rejected`, and the
next version publishes and swaps in as usual. A checkpoint directory whose files changed is refused
the same way. At start the server sweeps what the deployment left (stale and unfinished versions) and
reports foreign files (an event and `server/foreign_weight_files`), and publishing keeps working; a restart
never starts from a durable checkpoint whose files changed (it starts from the nearest good ancestor)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from liveloop.checkpoint import checkpoint_digest
from liveloop.metrics import Metrics
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.control.activator import Activator
from liveloop.server.control.startup import start_point, sweep_shared_memory
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, byte_view, make_receiver, make_sender
from liveloop.transport import shared_memory as shm


def moved(engine, delta: float) -> dict[str, torch.Tensor]:
    return {k: v + delta for k, v in engine.model.state_dict().items()}


def publish(store, config: TransportConfig, version: int, parent: int, weights: dict[str, torch.Tensor], tmp_path: Path):
    """What the learner does: hand the tensors over, then record the row with the handle's nonce and digest."""
    sender = make_sender(config)
    sender.start_update(version)
    sender.send(weights)
    handle = sender.finish()
    store.versions.add_version(
        version, parent=parent, checkpoint_path=str(tmp_path / f"v{version:06d}" / "policy"), status=VersionStatus.PUBLISHED,
        weights_nonce=handle.nonce, weights_digest=handle.digest,
    )
    return handle


def serves(engine, weights: dict[str, torch.Tensor]) -> bool:
    own = engine.model.state_dict()
    return all(torch.equal(byte_view(own[k]), byte_view(v)) for k, v in weights.items())


async def generate(engine) -> int:
    request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=3, seed=1))
    async with engine.generate(request) as gen:
        async for _ in gen:
            pass
    return gen.version


def rejected(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("liveloop_server_weights_rejected_total") or 0.0


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_tampered_memory_never_serves_and_publishing_goes_on(engine, store, namespace, tmp_path):
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    metrics = Metrics()
    activator = Activator(engine, store.versions, store.operator, metrics, receiver=make_receiver(config))
    v1 = moved(engine, 0.01)
    publish(store, config, 1, 0, v1, tmp_path)
    assert (await activator.activate(store.versions.get_version(1))).version == 1 and serves(engine, v1)

    # version 2 is published, then a same-user process writes into its segment (right name, wrong bytes)
    publish(store, config, 2, 1, moved(engine, 0.02), tmp_path)
    (data,) = [n for n in shm.segments(namespace)[2] if not n.endswith(".m")]
    with (shm.directory(namespace) / data).open("r+b") as f:
        f.seek(64)
        f.write(b"\xff\xff\xff\x7f")
    assert await activator.activate(store.versions.get_version(2)) is None
    assert engine.version == 1 and serves(engine, v1) and await generate(engine) == 1  # the old one serves
    assert store.versions.get_version(2).status == VersionStatus.FAILED
    (event,) = [e for e in store.operator.events() if e.kind == "weights_rejected"]
    assert event.version == 2 and "digest" in event.detail["reason"] and event.detail["serving"] == 1
    assert rejected(metrics) == 1

    # version 3 (built on 2 by a learner that never knew) is replaced whole under its name
    publish(store, config, 3, 2, moved(engine, 0.03), tmp_path)
    publish_over = make_sender(config)
    publish_over.start_update(3)
    publish_over.send(moved(engine, 5.0))
    publish_over.finish()
    assert await activator.activate(store.versions.get_version(3)) is None
    assert engine.version == 1 and store.versions.get_version(3).status == VersionStatus.FAILED and rejected(metrics) == 2

    # the next genuine version swaps in as usual
    v4 = moved(engine, 0.04)
    publish(store, config, 4, 3, v4, tmp_path)
    assert (await activator.activate(store.versions.get_version(4))).version == 4
    assert engine.version == 4 and serves(engine, v4) and await generate(engine) == 4


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_changed_checkpoint_directory_never_serves(engine, store, model_dir, namespace, tmp_path):
    """The durable copy, when the memory is gone: verified against the row's checkpoint_sha256."""
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    metrics = Metrics()
    activator = Activator(engine, store.versions, store.operator, metrics, receiver=make_receiver(config))
    writer = make_sender(TransportConfig(), path_for=lambda v: tmp_path / f"v{v:06d}" / "policy", base_model=model_dir)
    writer.start_update(1)
    writer.send(moved(engine, 0.01))
    durable = writer.finish()
    store.versions.add_version(1, parent=0, checkpoint_path=durable.location, checkpoint_sha256=durable.digest, status=VersionStatus.PUBLISHED)
    f = Path(durable.location) / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x55
    f.write_bytes(bytes(data))
    assert await activator.activate(store.versions.get_version(1)) is None
    assert engine.version == 0 and store.versions.get_version(1).status == VersionStatus.FAILED and rejected(metrics) == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_start_sweeps_stale_memory_and_reports_foreign_files(engine, store, namespace, tmp_path):
    config = TransportConfig(backend="shared_memory", namespace=namespace, keep_versions=5)
    publish(store, config, 1, 0, moved(engine, 0.01), tmp_path)
    store.versions.activate_version(1)
    publish(store, config, 2, 1, moved(engine, 0.02), tmp_path)
    store.versions.fail_version(2)  # nothing will ever serve it
    killed = make_sender(config)
    killed.start_update(3)
    killed.send(moved(engine, 0.03))  # the learner was killed here: no manifest, no row
    (shm.directory(namespace) / "planted-by-someone").write_bytes(b"x")
    metrics = Metrics()

    sweep_shared_memory(store.versions, store.operator, config, metrics)  # what the server does at start

    assert sorted(shm.segments(namespace)) == [1]  # the serving version's memory stays
    (event,) = [e for e in store.operator.events() if e.kind == "foreign_weights"]
    assert [Path(f["path"]).name for f in event.detail["files"]] == ["planted-by-someone"]
    assert metrics.registry.get_sample_value("liveloop_server_foreign_weight_files_total") == 1
    # and publishing keeps working with the foreign file still there
    activator = Activator(engine, store.versions, store.operator, metrics, receiver=make_receiver(config))
    v3 = moved(engine, 0.05)
    publish(store, config, 3, 1, v3, tmp_path)
    assert (await activator.activate(store.versions.get_version(3))).version == 3 and serves(engine, v3)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_restart_never_starts_from_a_changed_checkpoint(store, model_dir, tmp_path):
    writer = make_sender(TransportConfig(), path_for=lambda v: tmp_path / f"v{v:06d}" / "policy", base_model=model_dir)
    for v in (1, 2):  # both durable; version 2 served before the restart
        writer.start_update(v)
        writer.send({"w": torch.full((3,), float(v))})
        handle = writer.finish()
        store.versions.add_version(v, parent=v - 1, checkpoint_path=handle.location, checkpoint_sha256=handle.digest, status=VersionStatus.PUBLISHED)
        store.versions.activate_version(v)
    (Path(handle.location) / "model.safetensors").write_bytes(b"someone else's weights")

    point = await start_point(store.versions, store.versions.get_version(2), None)

    assert (point.version, point.skipped) == (1, (2,))
    # it starts from version 1's verified private copy (what loads is what was hashed), not its directory
    assert Path(point.weights_path) == point.copy.path != Path(store.versions.get_version(1).checkpoint_path)
    assert checkpoint_digest(point.weights_path) == store.versions.get_version(1).checkpoint_sha256
    point.release()
    assert not Path(point.weights_path).exists()
    assert store.versions.get_version(2).status == VersionStatus.FAILED and store.versions.get_version(1).status == VersionStatus.SERVING
    (event,) = [e for e in store.operator.events() if e.kind == "weights_rejected"]
    assert event.version == 2 and event.detail["at"] == "start"
