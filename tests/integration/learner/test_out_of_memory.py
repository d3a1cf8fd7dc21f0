"""Issue 43, item 6: a step that runs out of memory leaves the served version untouched and says so, and
learning goes on (learner/memory.py). The allocation failures are real: the process's data limit
(RLIMIT_DATA) is set just above what it holds, so torch's CPU allocator refuses the long reply's step as
it would on a full machine. In-process `OnlineLearner` on the tiny model and a real SQLite store."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import resource
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import GRPOConfig, LearnerConfig
from liveloop.learner.online import OnlineLearner
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

LONG = 500  # response tokens of a reply whose step does not fit in ROOM
MID = 150  # response tokens of a reply whose step fits alone, and four of them together not
ROOM = 20 * 2**20  # bytes the process may grow by while limited


def _vm_data() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


@contextlib.contextmanager
def _memory_nearly_full(room: int) -> Iterator[None]:
    """The process may allocate `room` more bytes of data, no more, until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_vm_data() + room, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _reply(store: Store, rid: str, length: int, reward: int = 1, group: str | None = None) -> None:
    rng = np.random.default_rng(sum(map(ord, rid)))
    response = tuple(int(x) for x in rng.integers(5, 500, length))
    rec = ResponseRecord(
        rid, "k", "m", 0, "chat", tuple(int(x) for x in rng.integers(5, 500, 6)), response,
        (-2.0,) * length, "stop", 1.0, 1.0, 1.0, request_meta={"group": group} if group else None,
    )
    store.feedback.write_batch([rec])
    store.feedback.put_feedback(FeedbackRecord(rid, "k", reward))


def _learner(store: Store, tmp_path, model_dir, **kw) -> OnlineLearner:
    cfg = LearnerConfig(checkpoint_dir=str(tmp_path / "versions"), publish_every_seconds=3600, max_per_key_per_batch=8, **kw)
    return OnlineLearner.resume(
        cfg, CriticConfig(), model_dir,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )


def _run_limited(db: str, versions: str, model_dir: str, config: dict, warm: int, replies: list[tuple[str, int]],
                 room: int, out: object) -> None:
    """In a fresh process (its heap holds only this): a learner (LearnerConfig `config`) takes one step on
    `warm` short ratings unlimited, then steps on `replies` (name, response tokens) with `room` bytes to
    grow by, until it has consumed them (at most 16 steps). Puts what happened on `out`. For a group
    method the warm ratings are one group and the replies another."""
    import torch

    torch.set_num_threads(1)
    store = Store(StoreConfig(url=db))
    learner = _learner(store, Path(versions), Path(model_dir), publish_every_steps=1, **config)
    grouped = "grpo" in config.get("method", "")
    for i in range(warm):
        _reply(store, f"warm{i}", 8, reward=i % 2, group="warm" if grouped else None)
    assert learner.step() and learner.state.version == 1
    served = store.versions.get_version(1)
    for i, (name, length) in enumerate(replies):
        _reply(store, name, length, reward=i % 2, group="replies" if grouped else None)
    end, steps = warm + len(replies), 0
    with _memory_nearly_full(room):
        while learner.state.pending_cursor < end and steps < 16:
            learner.step()
            steps += 1
    s, m = learner.state, learner.status().lanes[0].metrics
    out.put({
        "version": s.version, "samples": s.samples, "cursor": s.cursor, "pending_cursor": s.pending_cursor, "steps": steps,
        "versions": [v.version for v in store.versions.list_versions()],
        "served_unchanged": store.versions.get_version(1) == served,
        "failures": learner.memory.failures, "limit": learner.memory.batch_limit,
        "out_of_memory_steps": m.get("learner/out_of_memory_steps"),
        "skipped": m.get("learner/skipped_samples"), "skipped_memory": m.get("learner/skipped_samples_memory"),
    })
    store.close()


def _limited(store_dir: Path, model_dir: Path, config: dict, warm: int, replies: list[tuple[str, int]], room: int) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    db = f"sqlite:///{store_dir / 'l.db'}"
    store = Store(StoreConfig(url=db))
    store.migrate()
    store.versions.ensure_base_version(str(model_dir))
    store.close()
    child = ctx.Process(target=_run_limited, args=(db, str(store_dir / "versions"), str(model_dir), config, warm, replies, room, out))
    child.start()
    try:
        for _ in range(300):  # bounded: the child's run takes seconds
            with contextlib.suppress(queue.Empty):
                return out.get(timeout=1)
            assert child.is_alive(), f"the learner's process ended with {child.exitcode} before it answered"
        raise AssertionError("the learner's process did not answer within 300 s")
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()


@pytest.fixture(autouse=True)
def _linux_data_limit():
    if not hasattr(resource, "RLIMIT_DATA"):
        pytest.skip("needs RLIMIT_DATA")


def test_a_reply_too_big_to_train_is_passed_and_the_served_version_stays(tmp_path, model_dir):
    r = _limited(tmp_path, model_dir, {"batch_size": 1}, 1, [("long", LONG), ("short", 8)], ROOM)
    assert r["failures"] == 2  # alone, twice: then passed, untrained
    assert (r["version"], r["samples"], r["cursor"]) == (2, 2, 3)  # the short one behind it trained in the same room
    assert r["versions"] == [0, 1, 2] and r["served_unchanged"]  # nothing was published from a failed step
    assert r["out_of_memory_steps"] == 2.0 and r["skipped"] == 1.0 and r["skipped_memory"] == 1.0


def test_a_batch_that_does_not_fit_trains_one_rating_at_a_time(tmp_path, model_dir):
    r = _limited(tmp_path, model_dir, {"batch_size": 4}, 4, [(f"mid{i}", MID) for i in range(4)], ROOM)
    assert r["failures"] == 1  # the batch of four; each alone fits
    assert (r["samples"], r["cursor"], r["skipped"]) == (4 + 4, 8, 0.0)
    assert r["limit"] is None and r["versions"] == [0, 1, 2, 3, 4, 5]  # past the failed batch, batches grow again


def test_a_group_that_does_not_fit_is_passed_whole(tmp_path, model_dir):
    """GRPO's batch is a group, which is not split: it is tried twice, then passed, and nothing is lost
    behind it (the group left the method's buffer at the first try: it is read again for the second)."""
    r = _limited(tmp_path, model_dir, {"method": "grpo", "grpo": GRPOConfig(group_size=2)}, 2,
                 [("long0", LONG), ("long1", LONG)], ROOM)
    assert r["failures"] == 2 and (r["samples"], r["pending_cursor"]) == (2, 4)  # past the group (its cursor: the next publish)
    assert r["versions"] == [0, 1] and r["served_unchanged"]
    assert r["skipped_memory"] == 2.0
