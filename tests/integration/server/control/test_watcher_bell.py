"""The version watcher and the shared_memory transport's bell, on a real hf engine and real SQLite and
PostgreSQL: a learner's publish through the real sender (its memory finished, which rings, then its row)
serves without the watcher's poll, which here is an hour: the watcher wakes at the ring and looks again
until the row is there. Each activation records where its time went (the metric
`server/publish_to_serve_seconds`, and the log line bench/feedback_to_live.py reads)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.server.control.activator import Activator
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, make_receiver, make_sender
from liveloop.transport import shared_memory as shm

HOUR = 3600.0


@pytest.fixture(scope="module")
def state(tmp_path_factory, model_dir) -> dict:
    from transformers import AutoModelForCausalLM

    path = perturbed_checkpoint(model_dir, tmp_path_factory.mktemp("bell") / "v1", seed=1)
    return AutoModelForCausalLM.from_pretrained(str(path)).state_dict()


async def _until(condition, what: str) -> None:
    for _ in range(6000):  # a liveness bound, far under the watcher's hour-long poll
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_ring_wakes_the_watcher_without_its_poll(engine, store, state, namespace, caplog):
    config = TransportConfig(backend="shared_memory", namespace=namespace)
    sender = make_sender(config)
    sender.init()
    metrics = Metrics()
    activator = Activator(engine, store.versions, store.operator, metrics, receiver=make_receiver(config))
    watcher = asyncio.create_task(activator.watch(HOUR))
    try:
        folder = shm.directory(namespace)
        await _until(lambda: any(p.name.startswith("bell-") for p in folder.iterdir()), "the watcher has no bell")
        await _until(lambda: activator.looked_at > 0, "the watcher never looked")
        first_look = activator.looked_at
        version = store.versions.next_version()
        sender.start_update(version)
        sender.send(state)
        handle = sender.finish()  # rings: the row is not there yet
        with caplog.at_level(logging.INFO, logger="liveloop.server.control.activator"):
            await asyncio.to_thread(  # beside the watcher, which may look before the row is written
                store.versions.publish_version, version, parent=0, checkpoint_path=str(folder / "not-durable-yet"), checkpoint_sha256=None, learner_step=1,
                samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=0, weights_nonce=handle.nonce, weights_digest=handle.digest,
            )
            # served, recorded, and its timeline written (the engine serves it a moment before the rest)
            await _until(lambda: b"publish_to_serve_seconds" in metrics.render(), "the rung version never served")
        assert engine.version == version and activator.looked_at > first_look and activator.last_swap_via == "shared_memory"
        assert store.versions.get_version(version).status == VersionStatus.SERVING
        assert any(f"version {version} served" in r.getMessage() and "found after" in r.getMessage() for r in caplog.records)
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
    assert not any(p.name.startswith("bell-") for p in shm.directory(namespace).iterdir()), "the bell outlived its watcher"
