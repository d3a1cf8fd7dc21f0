"""Checkpoint retention and a full disk, with a real OnlineLearner on the tiny model and a real SQLite
store: after each publish only the kept versions' directories remain (pruned rows marked, the pinned
one kept); a checkpoint_dir on a size-limited tmpfs pauses learning instead of crashing, leaves no
partial checkpoint, and loses nothing once the operator frees space and resumes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.store import Store, StoreConfig
from liveloop.store.status import VersionNotFound


# -- store queries ---------------------------------------------------------------------------------
def test_set_pinned_and_mark_pruned(store_url):
    store = Store(StoreConfig(url=store_url))
    try:
        store.migrate()
        store.versions.ensure_base_version("/base")
        for v, status in [(1, "retired"), (2, "retired"), (3, "serving"), (4, "published"), (5, "superseded")]:
            store.versions.add_version(v, parent=v - 1, checkpoint_path=f"/ckpt/v{v}/policy", status=status)
        assert store.versions.set_pinned(2, True) is True
        assert store.versions.set_pinned(2, True) is False  # unchanged
        assert store.versions.set_pinned(5, True) and store.versions.set_pinned(5, False)
        with pytest.raises(VersionNotFound):
            store.versions.set_pinned(99, True)
        store.versions.add_version(6, parent=5, checkpoint_path="/ckpt/v6/policy", status="superseded")
        with store.transaction() as s:  # a learner resumes from version 6
            store.versions.set_cursor("sao", 0, 6, session=s)
        # 0 is the base, 2 pinned, 3 serving, 4 published, 6 a learner's cursor: only 1 and 5 are marked
        assert store.versions.mark_pruned([0, 1, 2, 3, 4, 5, 6, 99]) == [1, 5]
        assert store.versions.mark_pruned([1]) == []  # already pruned
        rows = {r.version: r for r in store.versions.list_versions()}
        assert {v for v, r in rows.items() if r.pruned_at is not None} == {1, 5}
        assert {v for v, r in rows.items() if r.pinned} == {2}
        kinds = [(e.kind, e.version, e.detail.get("versions")) for e in store.operator.events()]
        assert kinds == [("pin", 2, None), ("pin", 5, None), ("unpin", 5, None), ("prune", None, [1, 5])]
    finally:
        store.close()


# -- retention after each publish ------------------------------------------------------------------
def test_retention_keeps_serving_chain_newest_and_pinned(rate, store, tmp_path, model_dir):
    rate(store, 8)
    versions = tmp_path / "versions"
    cfg = LearnerConfig(
        checkpoint_dir=str(versions), publish_every_steps=1, publish_every_seconds=3600, poll_seconds=0.01,
        keep_last_versions=2, keep_parent_chain=1,
    )
    learner = OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    serving = 0
    for v in range(1, 9):
        assert learner.step() and learner.state.version == v  # publish_every_steps=1: one version a step
        # what the server's watcher would do: activate 1..5; then it falls behind, superseding 6 and 7
        if v <= 5:
            store.versions.activate_version(v)
            serving = v
        elif v >= 7:
            store.versions.supersede([v - 1])
        if v == 1:
            assert store.versions.set_pinned(1, True)
    # kept: 1 pinned, 5 serving and its parent 4 (K=1), 7 and 8 newest (N=2); 0 is the base model
    assert sorted(p.name for p in versions.iterdir()) == ["v000001", "v000004", "v000005", "v000007", "v000008"]
    for name in ("v000001", "v000004", "v000005", "v000007", "v000008"):
        assert (versions / name / "policy" / "model.safetensors").is_file() and (versions / name / "critic").is_dir()
    rows = {r.version: r for r in store.versions.list_versions()}
    assert {v for v, r in rows.items() if r.pruned_at is not None} == {2, 3, 6}
    assert rows[1].pinned and rows[1].pruned_at is None
    assert rows[0].pruned_at is None and Path(rows[0].checkpoint_path).is_dir()  # the base model is untouched
    prunes = [e.detail["versions"] for e in store.operator.events() if e.kind == "prune"]
    assert prunes == [[2], [3], [6]]  # after publishing 5, 6 and 8


# -- disk full -------------------------------------------------------------------------------------
class SmallDisk:
    """A tmpfs of a given size mounted on `path` (needs root, or CAP_SYS_ADMIN)."""

    def __init__(self, path: Path):
        self.path = path

    def mount(self, size: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)], capture_output=True, text=True)

    def grow(self, size: str) -> None:  # the operator frees space
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.path)], check=True, capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    disk = SmallDisk(tmp_path / "small")
    disk.path.mkdir()
    try:
        done = disk.mount("1m")  # smaller than one policy checkpoint (2.3 MB)
    except FileNotFoundError:
        pytest.skip("no `mount` command: cannot make a size-limited filesystem for checkpoint_dir")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield disk
    finally:
        disk.unmount()


def test_disk_full_pauses_learning_and_loses_nothing(rate, store, small_disk, model_dir):
    rate(store, 3)
    versions = small_disk.path / "versions"
    cfg = LearnerConfig(checkpoint_dir=str(versions), publish_every_steps=3, publish_every_seconds=3600, poll_seconds=0.01)
    learner = OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=3)  # the third step's publish runs out of disk: no crash
    assert learner.paused and store.operator.learning_paused("sao")
    assert store.versions.versions_with_status("published") == [] and store.feedback.get_cursor("sao") == 0
    assert list(versions.iterdir()) == []  # the partial temp directory is gone
    events = store.operator.events()
    assert [e.kind for e in events] == ["disk_full", "pause"]
    assert events[0].detail["unpublished_samples"] == 3 and events[0].detail["pending_cursor"] == 3
    assert events[1].detail["reason"].startswith("disk full: ")
    assert learner.state.pending_cursor == 3 and learner.state.steps_since_publish == 3  # kept in memory

    # while paused the loop keeps running, neither training nor publishing
    rate(store, 1, start=3)
    polls = iter(range(5))
    learner.run(lambda: next(polls, None) is None)
    assert learner.state.step == 3 and store.versions.versions_with_status("published") == []

    # the operator frees space and resumes: the next version carries all four ratings
    small_disk.grow("64m")
    store.operator.set_learning_paused("sao", False)
    learner.run(lambda: False, max_steps=4)
    (published,) = store.versions.versions_with_status("published")
    assert (published.version, published.parent, published.samples_used) == (1, 0, 4)
    assert store.feedback.get_cursor("sao") == 4 and store.versions.cursor_version("sao") == 1
    assert sorted(p.name for p in versions.iterdir()) == ["v000001"]
    assert (versions / "v000001" / "critic" / "model.safetensors").is_file()
