"""The activator activating versions through the transport, on a real hf engine (models/liveloop-tiny):
a version a separate process sent through shared memory swaps in from memory, byte for byte; a
version whose memory is gone waits for its durable checkpoint and is never served without weights;
a restarting server falls back to memory or to the nearest ancestor on disk."""

from __future__ import annotations

import multiprocessing as mp
import uuid
from pathlib import Path

import pytest
import torch

from liveloop.metrics import Metrics
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.control.activator import NotServable, Activator
from liveloop.server.control.startup import finish_start, start_point
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, WeightHandle, byte_view, make_receiver, make_sender
from liveloop.transport import shared_memory as shm


def _learner_sends(model_dir: str, namespace: str, version: int, seed: int, out) -> None:
    """A learner in another process: the tiny model's weights, moved, sent through shared memory."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    sender = make_sender(TransportConfig(backend="shared_memory", namespace=namespace))
    sender.start_update(version)
    state = model.state_dict()
    names = list(state)
    half = len(names) // 2
    sender.send({k: state[k] for k in names[:half]})  # several sends, like a layer at a time
    sender.send({k: state[k] for k in names[half:]})
    out.put(sender.finish().to_json())


def send_from_another_process(model_dir: Path, namespace: str, version: int, seed: int) -> WeightHandle:
    """The handle the learner finished: its nonce and digest are what it records in the version's row."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_learner_sends, args=(str(model_dir), namespace, version, seed, out))
    p.start()
    handle = WeightHandle.from_json(out.get(timeout=300))
    p.join(300)
    assert p.exitcode == 0
    return handle


def row_of(handle: WeightHandle) -> dict[str, str | None]:
    """What the learner records in the version's row from the handle it finished."""
    return {"weights_nonce": handle.nonce, "weights_digest": handle.digest}


async def generate(engine, n: int = 4) -> tuple[int, list[int]]:
    request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=n, seed=1))
    tokens: list[int] = []
    async with engine.generate(request) as gen:
        async for delta in gen:
            tokens += delta.token_ids
    return gen.version, tokens


def served_state_equals(engine, expected: dict[str, torch.Tensor]) -> bool:
    own = engine.model.state_dict()
    return all(torch.equal(byte_view(own[k]), byte_view(v)) for k, v in expected.items())


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_version_sent_by_another_process_swaps_in_from_memory(engine, store, model_dir, namespace, tmp_path):
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    receiver = make_receiver(config)
    sent = send_from_another_process(model_dir, namespace, 1, seed=3)
    expected = receiver.tensors(sent)
    assert not served_state_equals(engine, expected)
    durable = tmp_path / "v000001" / "policy"  # where the learner will write it, after the swap
    store.versions.add_version(1, parent=0, checkpoint_path=str(durable), status=VersionStatus.PUBLISHED, **row_of(sent))
    activator = Activator(engine, store.versions, store.operator, Metrics(), receiver=receiver)

    result = await activator.activate(store.versions.get_version(1))

    assert result is not None and activator.last_swap_via == "shared_memory" and result.version == 1
    assert engine.version == 1
    assert store.versions.get_version(1).status == VersionStatus.SERVING
    assert store.versions.get_version(0).status == VersionStatus.RETIRED
    assert served_state_equals(engine, expected)
    version, tokens = await generate(engine)
    assert version == 1 and len(tokens) == 4
    # no durable checkpoint yet: its memory stays (the learner releases it once written)
    assert 1 in shm.segments(namespace)
    # the next version: older memory goes once it is loaded
    sent = send_from_another_process(model_dir, namespace, 2, seed=4)
    store.versions.add_version(2, parent=1, checkpoint_path=str(tmp_path / "v000002" / "policy"), status=VersionStatus.PUBLISHED, **row_of(sent))
    assert await activator.activate(store.versions.get_version(2)) is not None and activator.last_swap_via == "shared_memory"
    assert sorted(shm.segments(namespace)) == [2]
    # a rollback reads durable checkpoints only: refused while version 1's is not written
    with pytest.raises(NotServable, match="durable checkpoint"):
        await activator.rollback(1)
    assert engine.version == 2


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_memory_gone_waits_for_the_durable_checkpoint(engine, store, model_dir, namespace, tmp_path):
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    activator = Activator(engine, store.versions, store.operator, Metrics(), receiver=make_receiver(config), durable_wait_seconds=3600)
    durable = tmp_path / "v000001" / "policy"
    store.versions.add_version(1, parent=0, checkpoint_path=str(durable), status=VersionStatus.PUBLISHED)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}

    assert await activator.activate(store.versions.get_version(1)) is None  # nothing to load yet: it waits
    assert engine.version == 0 and store.versions.get_version(1).status == VersionStatus.PUBLISHED
    assert served_state_equals(engine, before)

    # the learner writes the durable checkpoint (here through the checkpoint_dir transport)
    writer = make_sender(TransportConfig(), path_for=lambda v: durable, base_model=model_dir)
    moved = {k: v + 0.01 for k, v in before.items()}
    writer.start_update(1)
    writer.send(moved)
    writer.finish()
    result = await activator.activate(store.versions.get_version(1))
    assert result is not None and activator.last_swap_via == "checkpoint_dir" and engine.version == 1
    assert served_state_equals(engine, moved)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_version_without_weights_is_failed_after_the_wait_and_the_old_one_serves(engine, store, namespace, tmp_path):
    activator = Activator(engine, store.versions, store.operator, Metrics(), receiver=make_receiver(TransportConfig(backend="shared_memory", namespace=namespace)), durable_wait_seconds=0)
    store.versions.add_version(1, parent=0, checkpoint_path=str(tmp_path / "missing"), status=VersionStatus.PUBLISHED)
    assert await activator.activate(store.versions.get_version(1)) is None
    assert store.versions.get_version(1).status == VersionStatus.FAILED
    version, tokens = await generate(engine)
    assert version == 0 and tokens


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_restart_serves_memory_or_the_nearest_durable_ancestor(engine, store, model_dir, namespace, tmp_path):
    receiver = make_receiver(TransportConfig(backend="shared_memory", namespace=namespace))
    sent = send_from_another_process(model_dir, namespace, 1, seed=5)
    store.versions.add_version(1, parent=0, checkpoint_path=str(tmp_path / "v000001" / "policy"), status=VersionStatus.PUBLISHED, **row_of(sent))
    store.versions.activate_version(1)  # it served before the restart
    expected = receiver.tensors(sent)

    point = await start_point(store.versions, store.versions.get_version(1), receiver)
    assert (point.version, point.start_version, point.weights_path) == (1, 0, None) and point.memory is not None
    activator = Activator(engine, store.versions, store.operator, Metrics(), receiver=receiver)
    await finish_start(activator, point)
    assert engine.version == 1 and served_state_equals(engine, expected)

    shm.remove_version(namespace, 1)  # the machine restarted: memory gone, checkpoint never written
    point = await start_point(store.versions, store.versions.get_version(1), receiver, wait_seconds=0)
    assert (point.version, point.weights_path, point.skipped) == (0, None, (1,))
    assert store.versions.get_version(1).status == VersionStatus.FAILED
    assert store.versions.get_version(0).status == VersionStatus.SERVING
