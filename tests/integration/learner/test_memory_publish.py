"""The learner publishing through the in-memory transport (`[transport] backend = "shared_memory"`): the
version is handed over in shared memory and recorded, the durable checkpoint follows; a learner that
died before the durable checkpoint existed recovers it from memory at resume, or, with the memory gone
too, gives the version up and trains its ratings again. Real SQLite, real POSIX shared memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig, make_receiver
from liveloop.transport.checkpoint_dir import is_checkpoint
from liveloop.transport.shared_memory import remove_version, segments


@pytest.fixture
def transport(namespace):
    return TransportConfig(backend="shared_memory", namespace=namespace)


def _cfg(tmp_path) -> LearnerConfig:
    return LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=2, publish_every_seconds=3600)


def _learner(store, tmp_path, model_dir, transport) -> OnlineLearner:
    return OnlineLearner.resume(
        _cfg(tmp_path), CriticConfig(), model_dir, transport=transport,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def test_publish_hands_over_in_memory_then_writes_the_durable_checkpoint(store, tmp_path, model_dir, rate, transport):
    rate(store, 2)
    learner = _learner(store, tmp_path, model_dir, transport)
    assert learner.step() and learner.step()  # publishes version 1 after 2 steps
    learner.publishing.wait_durable()  # the durable checkpoint is written in the background
    record = store.versions.get_version(1)
    assert record.status == VersionStatus.PUBLISHED and store.feedback.get_cursor("sao") == 2
    assert is_checkpoint(record.checkpoint_path) and record.checkpoint_sha256
    receiver = make_receiver(transport)
    assert record.weights_nonce and record.weights_digest  # the handle's, recorded with the row
    memory = receiver.tensors(receiver.handle_of(record))  # verified against them
    trained = learner.policy.state_dict()
    assert memory.keys() >= {k for k in trained if not k.endswith("lm_head.weight")}
    assert all(torch.equal(memory[k], v) for k, v in trained.items() if k in memory)


def test_resume_recovers_the_durable_checkpoint_from_memory(store, tmp_path, model_dir, rate, transport):
    rate(store, 2)
    learner = _learner(store, tmp_path, model_dir, transport)
    learner.step(), learner.step()
    learner.publishing.wait_durable()
    trained = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    record = store.versions.get_version(1)
    shutil.rmtree(Path(record.checkpoint_path).parent)  # as if it died before writing it
    again = _learner(store, tmp_path, model_dir, transport)
    assert again.state.version == 1 and again.state.cursor == 2  # nothing trained twice
    assert is_checkpoint(record.checkpoint_path)
    assert all(torch.equal(trained[k], v) for k, v in again.policy.state_dict().items())


def test_resume_gives_up_a_version_whose_memory_and_checkpoint_are_gone(store, tmp_path, model_dir, rate, transport):
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir, transport)
    for _ in range(4):  # versions 1 (ratings 1-2) and 2 (ratings 3-4)
        learner.step()
    learner.publishing.wait_durable()
    record = store.versions.get_version(2)
    shutil.rmtree(Path(record.checkpoint_path).parent)
    remove_version(transport.namespace, 2)  # the machine rebooted: the memory is gone as well
    again = _learner(store, tmp_path, model_dir, transport)
    assert again.state.version == 1 and again.state.cursor == 2  # back to version 1: ratings 3-4 again
    assert store.versions.get_version(2).status == VersionStatus.FAILED
    assert again.step() and again.step()
    assert store.feedback.get_cursor("sao") == 4 and store.versions.cursor_version("sao") == 3


def test_a_clean_stop_frees_the_memory_once_every_checkpoint_is_durable(store, tmp_path, model_dir, rate, transport):
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir, transport)
    learner.run(lambda: False, max_steps=4)  # versions 1 and 2, then a clean stop
    assert {1, 2} <= {v.version for v in store.versions.versions_with_status(VersionStatus.PUBLISHED)}
    assert all(is_checkpoint(store.versions.get_version(v).checkpoint_path) for v in (1, 2))
    assert segments(transport.namespace) == {}


def test_a_learner_publishing_deltas_records_the_bytes_each_version_shipped(store, tmp_path, model_dir, rate, namespace):
    """`[transport] backend = "delta"`: the first version ships whole, the next as a delta against it; each
    row's metrics say how many bytes went and what the full copy would have been, and the delta rebuilds the
    learner's weights exactly."""
    delta = TransportConfig(backend="delta", namespace=namespace, delta_dir=str(tmp_path / "deltas"))
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir, delta)
    for _ in range(4):  # versions 1 and 2
        learner.step()
    learner.publishing.wait_durable()
    first, second = store.versions.get_version(1).metrics, store.versions.get_version(2).metrics
    assert first["transport/bytes"] >= first["transport/full_bytes"] > 0  # no parent yet: a full copy
    assert 0 < second["transport/bytes"] < second["transport/full_bytes"] == first["transport/full_bytes"]
    receiver = make_receiver(delta)
    with receiver.open(receiver.handle_of(store.versions.get_version(2))) as source:
        trained = learner.policy.state_dict()
        assert all(torch.equal(source.tensors[k], v) for k, v in trained.items() if k in source.tensors)
