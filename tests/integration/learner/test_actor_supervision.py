"""The co-located learner's supervisor on a real Ray and a real SQLite store: a SIGKILLed actor worker
is noticed, logged as an operator event and replaced by a fresh actor that resumes at the last published
version and cursor (every rating trained exactly once), also when the kill lands in the middle of a
publish; run() raising is a crash too, too many crashes and it reports failed; a clean close is not a crash."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray

from liveloop.checkpoint import checkpoint_digest
from liveloop.critic.config import CriticConfig
from liveloop.devtools import wait_until
from liveloop.learner.actor import ColocatedLearner, LearnerHealth, LearnerUnavailable
from liveloop.learner.config import LearnerConfig
from liveloop.segments import SegmentsConfig
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def store_config(tmp_path, model_dir) -> StoreConfig:
    config = StoreConfig(url=f"sqlite:///{tmp_path / 'l.db'}")
    s = Store(config)
    s.migrate()
    s.versions.ensure_base_version(str(model_dir))
    s.close()
    return config


@pytest.fixture
def store(store_config):
    s = Store(store_config)
    yield s
    s.close()


def _rate(store: Store, start: int, n: int) -> int:
    """n rated responses (one API key each); returns the last feedback id."""
    rng = np.random.default_rng(start)
    for i in range(start, start + n):
        rec = ResponseRecord(
            f"r{i}", f"k{i}", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)),
            tuple(int(x) for x in rng.integers(5, 500, 8)), (-2.0,) * 8, "stop", 1.0, 1.0, 1.0,
        )
        store.feedback.write_batch([rec])
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", f"k{i}", i % 2))
    return max(f.id for f, _ in store.feedback.rated_after(0, 10_000))


def _config(tmp_path: Path) -> LearnerConfig:
    return LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_steps=2, publish_every_seconds=3600, poll_seconds=0.05)



def _kill(learner: ColocatedLearner) -> int:
    pid = ray.get(learner.actor.pid.remote(), timeout=30)
    os.kill(pid, signal.SIGKILL)
    try:
        psutil.Process(pid).wait(30)  # gone (the raylet reaps it): it can write nothing more
    except psutil.NoSuchProcess:
        pass
    return pid


def _kinds(store: Store) -> list[str]:
    return [e.kind for e in store.operator.events() if e.kind.startswith("learner_")]


def _learned(store: Store) -> list[tuple[int, int | None, int]]:
    return [(v.version, v.parent, v.samples_used) for v in store.versions.list_versions() if v.version > 0]


def test_killed_actor_is_restarted_and_resumes_exactly_once(tmp_path, store_config, store, model_dir):
    _rate(store, 0, 5)
    learner = ColocatedLearner(store_config, _config(tmp_path), SegmentsConfig(), CriticConfig(), model_dir, backoff_s=0.1)
    try:
        assert learner.health() == LearnerHealth("running", 0, None)
        # v1 (ratings 1-2), v2 (3-4); rating 5 trained but not published when the worker dies
        wait_until(lambda: learner.status().pending_cursor == 5, 240, "rating 5 to be trained", interval=0.05)
        assert store.feedback.get_cursor("sao") == 4 and store.versions.cursor_version("sao") == 2
        old_pid = _kill(learner)
        last = _rate(store, 5, 3)  # ratings 6-8 arrive while it is dead
        wait_until(lambda: learner.health().state == "running" and learner.health().restarts == 1, 240, "the restart", interval=0.05)
        health = learner.health()
        assert "ActorDied" in health.last_error or "RayActorError" in health.last_error
        wait_until(lambda: store.feedback.get_cursor("sao") == last, 240, "the new actor to train the ratings added after the kill", interval=0.05)
        status = learner.status()
        assert status.cursor == last and ray.get(learner.actor.pid.remote()) != old_pid
        # the fresh actor resumed at v2 / cursor 4: rating 5 was trained again (its first training was
        # never published), and every rating is in exactly one version of one unbroken lineage
        assert _learned(store) == [(1, 0, 2), (2, 1, 2), (3, 2, 2), (4, 3, 2)]
        events = [e for e in store.operator.events() if e.kind.startswith("learner_")]
        assert [e.kind for e in events] == ["learner_crash", "learner_restart"]
        assert events[0].detail["restarts"] == 0 and events[0].detail["error"] == health.last_error
        assert events[1].version == 2 and events[1].detail == {"restarts": 1, "cursor": 4}
    finally:
        learner.close()
    assert learner.health().state == "stopped" and learner.health().restarts == 1
    assert _kinds(store) == ["learner_crash", "learner_restart"]  # a clean close is no crash
    with pytest.raises(LearnerUnavailable):
        learner.status()


def test_kill_in_the_middle_of_a_publish(tmp_path, store_config, store, model_dir):
    """The worker dies with its checkpoint written under its staging name but before the version row
    could commit (the test holds SQLite's write lock, so the inserting transaction, which allocates the
    number and moves the checkpoint to vNNNNNN, cannot begin): no version, no vNNNNNN directory; the
    fresh actor sweeps the dead process's staging directory and publishes version 1 itself."""
    store.operator.set_learning_paused("sao", True)
    _rate(store, 0, 2)
    config = _config(tmp_path)
    learner = ColocatedLearner(store_config, config, SegmentsConfig(), CriticConfig(), model_dir, backoff_s=0.1)
    root = Path(config.checkpoint_dir).resolve()

    def staged() -> list[Path]:
        return [p for p in root.glob(".staging-*") if (p / "policy").is_dir()] if root.is_dir() else []

    lock = sqlite3.connect(str(tmp_path / "l.db"), isolation_level=None, timeout=30)
    try:
        store.operator.set_learning_paused("sao", False)
        lock.execute("BEGIN IMMEDIATE")  # from here on, no other connection can write
        wait_until(staged, 120, "the first checkpoint under its staging name", interval=0.05)
        orphan = staged()[0]
        _kill(learner)
        assert store.versions.get_version(1) is None and store.feedback.get_cursor("sao") == 0  # killed before the row
        assert not (root / "v000001").exists()
        lock.execute("ROLLBACK")
        wait_until(lambda: learner.health().state == "running" and learner.health().restarts == 1, 240, "the restart", interval=0.05)
        last = _rate(store, 2, 2)
        wait_until(lambda: store.feedback.get_cursor("sao") == last, 240, "the new actor to train every rating", interval=0.05)
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
        learner.close()
    assert _learned(store) == [(1, 0, 2), (2, 1, 2)]
    v1 = store.versions.get_version(1)
    assert v1.checkpoint_path == str(root / "v000001" / "policy") and checkpoint_digest(v1.checkpoint_path) == v1.checkpoint_sha256
    assert _kinds(store) == ["learner_crash", "learner_restart"]
    assert not orphan.exists()  # the dead process's staging directory was swept
    assert not list(root.glob(".*staging-*"))  # nothing half-written left behind


def test_run_raising_is_a_crash_and_too_many_crashes_is_failed(tmp_path, store_config, store, model_dir):
    """run() raises at every publish (its checkpoint directory is a file): crash, one restart, crash
    again, and with max_restarts=1 the supervisor gives up and says failed."""
    config = _config(tmp_path)
    Path(config.checkpoint_dir).write_text("not a directory")
    _rate(store, 0, 2)
    learner = ColocatedLearner(store_config, config, SegmentsConfig(), CriticConfig(), model_dir, max_restarts=1, backoff_s=0.1)
    try:
        wait_until(lambda: learner.health().state == "failed", 240, "the supervisor to give up", interval=0.05)
        health = learner.health()
        assert health.restarts == 1 and health.last_error.startswith(("FileExistsError", "NotADirectoryError"))
        with pytest.raises(LearnerUnavailable, match="failed"):
            learner.status()
        wait_until(lambda: "learner_failed" in _kinds(store), 60, "the failure event", interval=0.05)
        assert _kinds(store) == ["learner_crash", "learner_restart", "learner_crash", "learner_failed"]
        assert store.feedback.get_cursor("sao") == 0 and _learned(store) == []  # nothing half-published
    finally:
        learner.close()
    assert learner.health().state == "stopped"
