"""Publishing that never queues (learner/publishing.py), on the tiny MoE and a real SQLite store:
`coalesce_versions` holds a due publish back while the next rating already waits and publishes once
nothing more waits (the held-back versions counted as superseded), still every `publish_every_seconds`,
and by the loop when the step it waited for does not come; without it a version follows every step as
before. An in-memory version's durable checkpoint is written when the learner has nothing to train (the
loop's idle turns) or before a third version's copies are taken, on the learner's own thread."""

from __future__ import annotations

import threading
import time

import pytest

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.learner.publishing import MAX_PENDING_DURABLE
from liveloop.store import VersionStatus
from liveloop.transport import TransportConfig
from liveloop.transport.checkpoint_dir import is_checkpoint


def _learner(store, tmp_path, model_dir, transport=None, **kw) -> OnlineLearner:
    base = {"checkpoint_dir": str(tmp_path / "versions"), "publish_every_steps": 1, "publish_every_seconds": 3600, "poll_seconds": 0.01}
    cfg = LearnerConfig(**(base | kw))
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir, transport=transport,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def _published(store) -> list[tuple[int, int]]:
    return [(v.version, v.samples_used) for v in store.versions.versions_with_status(VersionStatus.PUBLISHED)]


def test_ratings_faster_than_steps_make_one_version_not_one_each(store, tmp_path, model_dir, rate):
    rate(store, 5)  # five waiting; one key, so one rating a step (max_per_key_per_batch)
    learner = _learner(store, tmp_path, model_dir, coalesce_versions=True)
    for k in range(4):  # each step finds the next rating there: its version is held back
        assert learner.step() and _published(store) == [] and learner.publishing.held_back
    assert learner.step()  # the fifth: nothing waits any more, so it publishes, for all five
    assert _published(store) == [(1, 5)] and store.feedback.get_cursor("sao") == 5
    assert learner.publishing.superseded == 4 and store.versions.get_version(1).metrics["learner/superseded_versions"] == 4.0
    assert learner.lane_status().metrics["learner/superseded_versions"] == 4.0


def test_without_coalescing_every_step_publishes_whatever_waits(store, tmp_path, model_dir, rate):
    rate(store, 3)
    learner = _learner(store, tmp_path, model_dir)
    for _ in range(3):
        assert learner.step()
    assert _published(store) == [(1, 1), (2, 1), (3, 1)] and learner.publishing.superseded == 0


def test_a_version_still_follows_every_publish_every_seconds(store, tmp_path, model_dir, rate):
    rate(store, 3)
    learner = _learner(store, tmp_path, model_dir, coalesce_versions=True, publish_every_seconds=0.0)  # always overdue
    for _ in range(3):
        assert learner.step()
    assert _published(store) == [(1, 1), (2, 1), (3, 1)] and learner.publishing.superseded == 0


def test_the_loop_publishes_a_held_back_version_when_no_step_follows(store, tmp_path, model_dir, rate):
    # the third rating waits but is over its key's window cap: no step trains it, the loop publishes the two
    rate(store, 3)
    learner = _learner(store, tmp_path, model_dir, coalesce_versions=True, max_per_key_per_window=2)
    deadline = time.monotonic() + 120
    learner.run(lambda: bool(_published(store)) or time.monotonic() > deadline)
    assert time.monotonic() < deadline and _published(store) == [(1, 2)]
    assert learner.publishing.superseded == 1 and not learner.publishing.held_back


@pytest.fixture
def transport(namespace):
    return TransportConfig(backend="shared_memory", namespace=namespace)


def test_durable_checkpoints_wait_for_the_learner_to_have_nothing_to_train(store, tmp_path, model_dir, rate, transport):
    rate(store, 4)
    learner = _learner(store, tmp_path, model_dir, transport)
    threads = set(threading.enumerate())
    assert learner.step() and store.versions.get_version(1).status == VersionStatus.PUBLISHED  # handed over in memory
    assert not is_checkpoint(store.versions.get_version(1).checkpoint_path) and learner.publishing.stats()["learner/durable_pending"] == 1
    for _ in range(2):  # versions 2 and 3: the third's copies are taken only after the oldest is written
        assert learner.step()
    assert is_checkpoint(store.versions.get_version(1).checkpoint_path) and store.versions.get_version(1).checkpoint_sha256
    assert learner.publishing.stats()["learner/durable_pending"] == MAX_PENDING_DURABLE
    assert set(threading.enumerate()) <= threads  # no thread writes beside the steps
    learner.run(lambda: learner.publishing.stats()["learner/durable_pending"] == 0 and learner.state.step == 4)
    assert all(is_checkpoint(store.versions.get_version(v).checkpoint_path) and store.versions.get_version(v).checkpoint_sha256 for v in (2, 3, 4))


def test_a_busy_learner_writes_a_durable_checkpoint_that_waited_a_publish_interval(store, tmp_path, model_dir, rate, transport):
    # issue 46.4: under steady ratings the loop never idles; the serving version's parent must still become
    # durable (a rollback reads it), within about a publish interval, not only when a third version comes
    rate(store, 3)
    patient = _learner(store, tmp_path / "a", model_dir, transport)  # publish_every_seconds 3600: not overdue yet
    assert patient.step() and not patient.publishing.write_overdue() and patient.publishing.stats()["learner/durable_pending"] == 1
    patient.publishing.wait_durable()
    busy = _learner(store, tmp_path / "b", model_dir, transport, publish_every_seconds=0.0)
    assert busy.step()
    version = busy.state.version
    assert not is_checkpoint(store.versions.get_version(version).checkpoint_path)
    assert busy.publishing.write_overdue() and busy.publishing.stats()["learner/durable_pending"] == 0
    record = store.versions.get_version(version)
    assert is_checkpoint(record.checkpoint_path) and record.checkpoint_sha256
