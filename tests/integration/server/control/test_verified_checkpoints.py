"""What is loaded is what was verified, on a real hf engine (models/liveloop-tiny) and a real store: a
published version whose config.json (or tokenizer file) changed after publishing is refused by the
activation, the rollback and the restart, each with a "weights_rejected" event, while the serving
version keeps serving; and a checkpoint whose files change after they were hashed never loads those
changes: the engine loads the private copy that was hashed (the shared directory is not read again)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from liveloop.metrics import Metrics
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.control.activator import NotServable, Activator
from liveloop.server.control.startup import finish_start, start_point
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, byte_view, make_receiver, make_sender

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def moved(engine, delta: float) -> dict[str, torch.Tensor]:
    return {k: v + delta for k, v in engine.model.state_dict().items()}


def publish(store, engine, model_dir: Path, tmp_path: Path, version: int, parent: int, delta: float):
    """What the learner does: a durable checkpoint directory (weights and the base model's config
    files), then the row naming its digest. Returns the weights."""
    weights = moved(engine, delta)
    sender = make_sender(TransportConfig(), path_for=lambda v: tmp_path / f"v{v:06d}" / "policy", base_model=model_dir)
    sender.start_update(version)
    sender.send(weights)
    handle = sender.finish()
    store.versions.add_version(version, parent=parent, checkpoint_path=handle.location, checkpoint_sha256=handle.digest,
                      status=VersionStatus.PUBLISHED)
    return weights


def change_config(checkpoint: str | Path, **fields) -> None:
    """A same-user process edits a stored version's config.json (rope theta: every position's logits)."""
    path = Path(checkpoint) / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


def serves(engine, weights: dict[str, torch.Tensor]) -> bool:
    own = engine.model.state_dict()
    return all(torch.equal(byte_view(own[k]), byte_view(v)) for k, v in weights.items())


async def logprobs(engine) -> list[float]:
    request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3, 4), SamplingParams(max_tokens=4, temperature=0.0, seed=1))
    out: list[float] = []
    async with engine.generate(request) as gen:
        async for delta in gen:
            out.extend(delta.logprobs)
    return out


def rejections(store, version: int) -> list:
    return [e for e in store.operator.events() if e.kind == "weights_rejected" and e.version == version]


async def test_a_changed_config_is_refused_at_activation_and_the_old_version_keeps_serving(engine, store, model_dir, tmp_path):
    metrics = Metrics()
    activator = Activator(engine, store.versions, store.operator, metrics)
    before = await logprobs(engine)
    publish(store, engine, model_dir, tmp_path, 1, 0, 0.01)
    change_config(store.versions.get_version(1).checkpoint_path, rope_parameters={"rope_theta": 1.0, "rope_type": "default"})

    assert await activator.activate(store.versions.get_version(1)) is None
    assert engine.version == 0 and await logprobs(engine) == before
    assert store.versions.get_version(1).status == VersionStatus.FAILED
    (event,) = rejections(store, 1)
    assert "hashes to" in event.detail["reason"] and event.detail["serving"] == 0
    assert metrics.registry.get_sample_value("liveloop_server_weights_rejected_total") == 1

    # a tokenizer file the engine might read is covered too; an untouched version activates as usual
    v2 = publish(store, engine, model_dir, tmp_path, 2, 0, 0.02)
    (Path(store.versions.get_version(2).checkpoint_path) / "tokenizer.json").write_text("{}")
    assert await activator.activate(store.versions.get_version(2)) is None and rejections(store, 2)
    v3 = publish(store, engine, model_dir, tmp_path, 3, 0, 0.03)
    assert (await activator.activate(store.versions.get_version(3))).version == 3 and serves(engine, v3) and not serves(engine, v2)


async def test_a_rollback_to_a_version_whose_config_changed_is_refused(engine, store, model_dir, tmp_path):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    publish(store, engine, model_dir, tmp_path, 1, 0, 0.01)
    assert (await activator.activate(store.versions.get_version(1))).version == 1
    v2 = publish(store, engine, model_dir, tmp_path, 2, 1, 0.02)
    assert (await activator.activate(store.versions.get_version(2))).version == 2
    change_config(store.versions.get_version(1).checkpoint_path, num_attention_heads=2)

    with pytest.raises(NotServable, match="not the one its row names"):
        await activator.rollback(1)
    assert engine.version == 2 and serves(engine, v2) and store.versions.latest_version().version == 2
    (event,) = rejections(store, 1)
    assert event.detail["serving"] == 2


async def test_a_restart_never_starts_from_a_version_whose_config_changed(engine, store, model_dir, tmp_path):
    publish(store, engine, model_dir, tmp_path, 1, 0, 0.01)
    store.versions.activate_version(1)
    publish(store, engine, model_dir, tmp_path, 2, 1, 0.02)
    store.versions.activate_version(2)
    change_config(store.versions.get_version(2).checkpoint_path, rope_parameters={"rope_theta": 1.0, "rope_type": "default"})

    point = await start_point(store.versions, store.versions.get_version(2), None)

    assert (point.version, point.skipped) == (1, (2,))
    assert store.versions.get_version(2).status == VersionStatus.FAILED and store.versions.get_version(1).status == VersionStatus.SERVING
    (event,) = rejections(store, 2)
    assert event.detail["at"] == "start"
    point.release()


async def test_files_changed_after_hashing_are_not_what_loads(engine, store, model_dir, tmp_path):
    """The race: the checkpoint is hashed, then its files change before the engine reads them. The
    engine loads the copy that was hashed, both for a swap and for a (re)start."""
    v1 = publish(store, engine, model_dir, tmp_path, 1, 0, 0.01)
    record = store.versions.get_version(1)
    shared = Path(record.checkpoint_path)
    pristine = {f.name: f.read_bytes() for f in shared.iterdir()}
    other = tmp_path / "other"  # another complete checkpoint: what a writer puts in place of version 1's files
    sender = make_sender(TransportConfig(), path_for=lambda v: other, base_model=model_dir)
    sender.start_update(9)
    sender.send(moved(engine, 0.5))
    sender.finish()

    def replace_files() -> None:
        for name in ("model.safetensors", "config.json"):
            (shared / name).write_bytes((other / name).read_bytes())

    receiver = make_receiver(TransportConfig(backend="checkpoint_dir"))
    with receiver.open(receiver.handle_of(record)) as source:  # verified: its bytes are hashed here
        replace_files()  # ... and changed before the engine reads them
        await engine.update_weights(source, 1)
        assert Path(source.path) != shared and Path(source.path).stat().st_mode & 0o777 == 0o700  # a private copy
    assert engine.version == 1 and serves(engine, v1)
    assert not Path(source.path).exists()  # the copy goes once loaded

    # the restart: start_point verifies version 1, its files change, then the engine starts
    for name, data in pristine.items():
        (shared / name).write_bytes(data)
    store.versions.activate_version(1)
    point = await start_point(store.versions, store.versions.get_version(1), None)
    assert (point.version, point.start_version) == (1, 1)
    replace_files()
    restarted = type(engine)(engine.config, model_dir)
    await restarted.start(version=point.start_version, weights_path=point.weights_path)
    try:
        assert serves(restarted, v1)
        await finish_start(Activator(restarted, store.versions, store.operator, Metrics()), point)
        assert not Path(point.weights_path).exists()
    finally:
        await restarted.close()
