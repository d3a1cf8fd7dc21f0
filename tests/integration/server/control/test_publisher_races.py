"""The activator against races, on a real hf engine (models/liveloop-tiny) and real SQLite and
PostgreSQL: an activation the watcher queued before a rollback is dropped, never applied, while
traffic only ever sees the versions the store makes serving; an operator's swap becomes the learner's
lineage (a learner version on the old parent is never activated, a learner publish on it is refused);
and a version the store no longer lets serve is refused before the engine loads it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.control.activator import Activator
from liveloop.server.control.weights_import import WeightImports
from liveloop.store import StaleLineage, Store, VersionStatus

S = VersionStatus


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2, 3)]


def _learner_publish(store: Store, parent: int, checkpoint: Path) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


async def _traffic(engine, stop: asyncio.Event, served: list[int]) -> None:
    while not stop.is_set():
        request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=3, seed=1))
        async with engine.generate(request) as gen:
            async for _ in gen:
                pass
        served.append(gen.version)
        await asyncio.sleep(0)


async def test_an_activation_queued_before_a_rollback_is_dropped(engine, store, checkpoints):
    metrics = Metrics()
    activator = Activator(engine, store.versions, store.operator, metrics)
    v1 = _learner_publish(store, 0, checkpoints[0])
    assert (await activator.activate(store.versions.get_version(v1))).version == v1
    v2 = _learner_publish(store, v1, checkpoints[1])
    queued = store.versions.get_version(v2)  # what the watcher read: published, newer than the serving version

    stop, served = asyncio.Event(), []
    traffic = asyncio.create_task(_traffic(engine, stop, served))
    await asyncio.sleep(0.05)
    rollback = asyncio.create_task(activator.rollback(0, reason="guard"))
    await asyncio.sleep(0)
    assert activator.lock.locked()  # the rollback holds the activation lock; the activation queues behind it
    activation = asyncio.create_task(activator.activate(queued))
    result, dropped = await asyncio.gather(rollback, activation)
    await asyncio.sleep(0.05)
    stop.set()
    await traffic

    assert result.rolled_back == [v1, v2] and dropped is None
    assert engine.version == 0 and store.versions.latest_version().version == 0
    assert store.versions.get_version(v2).status == S.ROLLED_BACK
    assert served and set(served) <= {0, v1} and served[-1] == 0  # v2 never served
    assert [(e.kind, e.version) for e in store.operator.events()][-2:] == [("rollback", 0), ("activation_dropped", v2)]
    assert b"activations_dropped" in metrics.render()
    # the watcher's next pass finds nothing to activate: the rolled-back version stays off
    assert store.versions.versions_with_status(S.PUBLISHED, engine.version) == []


async def test_an_operator_swap_becomes_the_learner_lineage(engine, store, checkpoints, model_dir, tmp_path):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1 = _learner_publish(store, 0, checkpoints[0])
    await activator.activate(store.versions.get_version(v1))
    waiting = _learner_publish(store, v1, checkpoints[1])  # published on v1, not activated yet
    staged = WeightImports(tmp_path / "versions", model_dir, 1 << 30).stage(str(checkpoints[2]))  # what POST /admin/weights copies
    swapped = await activator.activate_import(staged, note="operator")
    assert (swapped.version, swapped.parent) == (waiting + 1, v1) and engine.version == swapped.version
    assert store.versions.cursor_version("sao") == swapped.version
    assert store.versions.get_version(waiting).status == S.SUPERSEDED
    # the watcher's stale read of the learner's version: dropped, the operator's version keeps serving
    assert await activator.activate(store.versions.get_version(waiting)) is None
    assert engine.version == swapped.version and store.versions.latest_version().version == swapped.version
    # the learner, still on v1, is refused; it reloads (its cursor names the operator's version) and goes on
    with pytest.raises(StaleLineage):
        _learner_publish(store, waiting, checkpoints[0])
    nxt = _learner_publish(store, swapped.version, checkpoints[0])
    assert (await activator.activate(store.versions.get_version(nxt))).version == nxt
    assert {v.version: v.status for v in store.versions.list_versions()} == {
        0: S.RETIRED, v1: S.RETIRED, waiting: S.SUPERSEDED, swapped.version: S.RETIRED, nxt: S.SERVING,
    }


async def test_the_store_is_asked_before_the_engine_loads(engine, store, checkpoints):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1 = _learner_publish(store, 0, checkpoints[0])
    record = store.versions.get_version(v1)
    store.versions.rollback_to(0, "sao")  # e.g. another server process, or a rollback the watcher raced
    assert await activator.activate(record) is None
    assert engine.version == 0 and store.versions.get_version(v1).status == S.ROLLED_BACK
