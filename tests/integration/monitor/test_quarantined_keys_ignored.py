"""A quarantined key's ratings move nothing the monitor decides on: not the guard (over the real
application, `build_app` with the transformers engine on the tiny model, as the admin API tests run
it: a quarantined key's ratings are not counted at all; released, its 40 ratings are one vote of 26
and still roll nothing back), nor the
drift detectors, time buckets and segments, nor the drift report's series and per-version rates."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, free_port, perturbed_checkpoint, write_config
from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.drift import ALL, DriftMonitor
from liveloop.monitor.report import collect
from liveloop.store import FeedbackRecord, ResponseRecord, Store

MONITOR = """
[monitor]
enabled = false
guard_min_ratings = 20
guard_p_value = 0.05
"""
QUARANTINED = "quarantined00000"


def _rate(store: Store, version: int, key_of, rewards: list[int], tag: str) -> None:
    replies = [
        ResponseRecord(f"{tag}-{i}", key_of(i), "m", version, "chat", (1, 2), (3, i % 7), (-1.0, -1.0), "stop", 1.0, 1.0, 1.0,
                       request_meta={"topic": tag})
        for i in range(len(rewards))
    ]
    store.feedback.write_batch(replies)
    store.feedback.write_batch([FeedbackRecord(r.id, r.api_key_id, reward) for r, reward in zip(replies, rewards)])


def _honest(i: int) -> str:
    return f"{i:016x}"  # a key per rating


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("quarantine-guard")
    port = free_port()
    path, _ = write_config(work, Path(model_dir).resolve(), "hf", port, extra=MONITOR)
    app = build_app(load_config(path), Path(model_dir))
    with TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False) as c:  # a Host the server answers to
        c.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield c


def test_a_quarantined_key_alone_cannot_trigger_the_guards_rollback(client, tmp_path):
    ops, store = client.app.state.server.operations, client.app.state.server.store
    base = Path(store.versions.get_version(0).checkpoint_path)
    r = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(base, tmp_path / "new", seed=3))})
    new = r.json()["version"]
    _rate(store, 0, _honest, [1] * 20 + [0] * 5, "base")
    _rate(store, new, _honest, [1] * 19 + [0] * 6, "new")  # honest users like it as much as its parent
    _rate(store, new, lambda i: QUARANTINED, [0] * 40, "bad")  # one key rates it down 40 times
    assert store.keys.set_quarantined(QUARANTINED, True, "by hand")

    rows = client.portal.call(ops.versions)
    assert {r.version: (r.reward.successes, r.reward.n) for r in rows}[new] == (19, 25)  # the key's 40 left out
    assert client.portal.call(ops.guard, rows) is None
    assert client.get("/admin/stats").json()["serving"] == new

    # released, the ratings are 19/65 against 20/25 (counted by rating, a rollback at p = 0.0002), but the
    # key is one vote: 19 of 26 keys against 20 of 25, not significantly worse
    assert store.keys.set_quarantined(QUARANTINED, False)
    rows = client.portal.call(ops.versions)
    row = {r.version: r for r in rows}[new]
    assert (row.reward.successes, row.reward.n, row.keys, row.votes) == (19, 65, 26, 19.0)
    assert client.portal.call(ops.guard, rows) is None
    assert client.get("/admin/stats").json()["serving"] == new


def _traffic(store: Store, n: int, seed: int) -> None:
    """n honest ratings (80% up, segment cats) interleaved with n of the quarantined key (all down, segment dogs)."""
    rng = random.Random(seed)
    recs, ratings = [], []
    for i in range(n):
        for key, topic, reward in (("honest0000000000", "cats", int(rng.random() < 0.8)), (QUARANTINED, "dogs", 0)):
            rid = f"{key}-{i}"
            recs.append(ResponseRecord(rid, key, "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": topic}))
            ratings.append(FeedbackRecord(rid, key, reward))
    store.feedback.write_batch(recs)
    store.feedback.write_batch(ratings)


def test_drift_and_its_report_ignore_quarantined_keys(store):
    store.keys.set_quarantined(QUARANTINED, True, "by hand")
    _traffic(store, 300, seed=1)
    monitor = DriftMonitor(MonitorConfig(), store.feedback)
    monitor.catch_up(batch=100)
    state = monitor.state()
    assert state["overall"]["ratings"] == monitor.detectors[ALL].count == 300
    assert set(state["segments"]) == {"cats"} and sum(b.reward.n for b in monitor.series()) == 300
    assert monitor.series()[0].reward.value > 0.7  # the honest rate, not diluted by the key's 300 downs

    report = collect(store, MonitorConfig(), since=None)
    assert sum(b.reward.n for b in report.series) == 300 and set(report.drift["segments"]) == {"cats"}
    assert {v.version: v.reward.n for v in report.versions}[0] == 300

    store.keys.set_quarantined(QUARANTINED, False)  # released: its ratings count from then on (and in a new report)
    assert sum(b.reward.n for b in collect(store, MonitorConfig(), since=None).series) == 600
