"""The admin API in-process over the real application (`build_app`: transformers engine on the tiny
model, SQLite, the writer): the activator's and the rollback's refusals leave as the same OpenAI-style
errors and statuses they always had (domain exceptions mapped at the edge), their typed results leave
as the same JSON keys, the dashboard's statuses are served, and the guard decides on typed rows and
rolls back through the activator.

The tests share one application and run in file order; each reads the versions it needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, free_port, perturbed_checkpoint, write_config
from liveloop.monitor.guard import judge
from liveloop.server.control.operations import tally_of
from liveloop.server.control.activator import RollbackResult
from liveloop.store import FeedbackRecord, ResponseRecord, VersionStatus

MONITOR = """
[monitor]
enabled = false
guard_min_ratings = 20
guard_p_value = 0.05
"""
VERSION_KEYS = [
    "version", "parent", "segment", "created", "status", "serving", "learner_step", "samples_used", "note", "metrics", "responses",
    "rating_rate", "reward", "vs_parent", "checkpoint", "rollback_target",
]


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("admin-api")
    port = free_port()
    path, _ = write_config(work, Path(model_dir).resolve(), "hf", port, extra=MONITOR)
    app = build_app(load_config(path), Path(model_dir))
    with TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False) as c:  # a Host the server answers to
        c.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield c


def _error(status: int, kind: str, message: str, param: str) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _answer(r) -> tuple[int, dict]:
    return r.status_code, r.json()


def _statuses(client: TestClient) -> dict[int, str]:
    return {v["version"]: v["status"] for v in client.get("/admin/versions").json()["data"]}


def test_publish_refusals_are_400s_on_the_path(client, tmp_path):
    missing = tmp_path / "nope"
    r = client.post("/admin/weights", json={"path": str(missing)})
    status, body = _answer(r)
    assert (status, body["error"]["code"]) == (400, "not_a_checkpoint")
    body["error"]["code"] = None
    assert (status, body) == _error(400, "invalid_request_error", f"path: {missing} is not a checkpoint directory with *.safetensors", "path")

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"not a safetensors file")
    r = client.post("/admin/weights", json={"path": str(junk)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("path", "unloadable_weights") and error["message"].startswith(f"path: {junk}/model.safetensors is not")
    assert list(_statuses(client)) == [0]  # refused before it could serve: no row

    # weights that pass the import's checks but not the engine's (non-finite): the row is FAILED
    nan = tmp_path / "nan"
    nan.mkdir()
    tensors = load_file(str(Path(_model(client)) / "model.safetensors"))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, str(nan / "model.safetensors"))
    r = client.post("/admin/weights", json={"path": str(nan)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(f"could not load {nan}: ") and error["param"] == "path" and error["type"] == "invalid_request_error"
    failed = max(_statuses(client))
    assert _statuses(client)[failed] == "failed" and client.get("/admin/stats").json()["serving"] == 0


def test_publish_and_rollback_answer_the_same_json(client, tmp_path):
    failed = max(_statuses(client))
    r = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "v")), "note": "new"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["object", "version", "parent", "swap_ms", "held_ms", "checkpoint_sha256", "completed", "left_behind"]
    new = body["version"]
    assert (body["object"], body["parent"], new) == ("policy_version", 0, failed + 1) and body["swap_ms"] >= body["held_ms"] >= 0

    assert _answer(client.post("/admin/rollback", json={"version": 999})) == _error(404, "not_found_error", "no policy version 999", "version")
    assert _answer(client.post("/admin/rollback", json={"version": failed})) == _error(
        409, "conflict_error", f"version {failed} cannot be served (status failed)", "version"
    )
    assert _answer(client.post("/admin/rollback", json={"version": new})) == _error(409, "conflict_error", f"version {new} is already serving", "version")
    assert _answer(client.post("/admin/versions/999/pin")) == _error(404, "not_found_error", "no policy version 999", "version")

    r = client.post("/admin/rollback", json={"version": 0, "reason": "test"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["object", "version", "previous", "rolled_back", "swap_ms", "held_ms"]
    assert (body["object"], body["version"], body["previous"], body["rolled_back"]) == ("rollback", 0, new, [new])

    listed = client.get("/admin/versions").json()
    assert listed["serving"] == 0 and listed["settled"] is True and all(list(v) == VERSION_KEYS for v in listed["data"])
    assert _statuses(client) == {0: "serving", failed: "failed", new: "rolled_back"}
    assert list(listed["data"][0]["reward"]) == ["n", "positive", "rate", "low", "high"]
    # paged, newest first and listed oldest first: a long-lived deployment has a version per step
    everything = [v["version"] for v in listed["data"]]
    assert listed["has_more"] is False and everything == sorted(everything) and len(everything) == 3
    newest = client.get("/admin/versions", params={"limit": 2}).json()
    assert [v["version"] for v in newest["data"]] == everything[-2:] and newest["has_more"] is True
    older = client.get("/admin/versions", params={"limit": 2, "before": everything[-2]}).json()
    assert [v["version"] for v in older["data"]] == everything[:1] and older["has_more"] is False
    assert client.get("/admin/versions", params={"limit": 0}).status_code == 400

    # a version whose checkpoint retention deleted cannot serve again
    assert client.app.state.server.store.versions.mark_pruned([new]) == [new]
    r = client.post("/admin/rollback", json={"version": new})
    assert r.status_code == 409 and r.json()["error"]["param"] == "version"
    assert f"version {new}'s checkpoint was pruned at " in r.json()["error"]["message"]
    rows = {v["version"]: v for v in client.get("/admin/versions").json()["data"]}  # the lineage says it is no rollback target
    assert (rows[new]["checkpoint"], rows[new]["rollback_target"]) == ("pruned", False)
    assert (rows[0]["checkpoint"], rows[0]["rollback_target"], rows[failed]["rollback_target"]) == ("durable", True, False)
    assert client.get("/admin/stats").json()["serving"] == 0


def test_the_dashboard_gets_the_statuses_from_the_server(client):
    r = client.get("/admin/statuses")
    assert r.status_code == 200
    served = {s["status"]: s for s in r.json()["data"]}
    assert list(served) == [s.value for s in VersionStatus]
    assert {name for name, s in served.items() if not s["servable"]} == {"failed", "loading"}
    assert all(s["description"] for s in served.values())
    script = client.get("/dashboard/static/dashboard.js").text
    assert "/admin/statuses" in script
    # no status spelled in the page's script ("serving" is also the id of its header element)
    assert not any(f'"{s.value}"' in script for s in VersionStatus if s is not VersionStatus.SERVING)
    assert "v.status ===" not in script and "includes(v.status)" not in script
    assert client.get("/admin/statuses", headers={"Authorization": "Bearer sk-test-user-1"}).status_code == 403


def test_pause_answers_the_learning_state(client):
    r = client.post("/admin/learning/pause", json={"reason": "looking"})
    assert r.json() == {"object": "learning", "learner": "sao", "paused": True, "changed": True}
    r = client.post("/admin/learning/resume", json={})
    assert r.json() == {"object": "learning", "learner": "sao", "paused": False, "changed": True}


def _rate(client: TestClient, version: int, liked: int, disliked: int, tag: str, keys: int | None = None) -> None:
    """Ratings of `version`, each from a key of its own, or spread over `keys` keys."""
    store = client.app.state.server.store
    replies = [
        ResponseRecord(f"{tag}-{i}", f"{i if keys is None else i % keys:016x}", "m", version, "chat", (1, 2), (3, i % 7), (-1.0, -1.0), "stop", 1.0, 1.0, 1.0,
                       request_meta={"topic": tag})
        for i in range(liked + disliked)
    ]
    store.feedback.write_batch(replies)
    store.feedback.write_batch([FeedbackRecord(r.id, r.api_key_id, int(i < liked)) for i, r in enumerate(replies)])


def test_guard_decides_on_typed_rows_and_rolls_back(client, tmp_path):
    ops = client.app.state.server.operations
    r = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "worse", seed=3))})
    worse = r.json()["version"]
    _rate(client, 0, liked=20, disliked=5, tag="base")
    _rate(client, worse, liked=5, disliked=20, tag="worse")
    rows = client.portal.call(ops.versions)
    assert {r.version: r.reward.n for r in rows}[worse] == 25

    done = client.portal.call(ops.guard, rows)
    assert isinstance(done, RollbackResult) and (done.version, done.previous, done.rolled_back) == (0, worse, [worse])
    assert client.portal.call(ops.guard, client.portal.call(ops.versions)) is None  # 0 has no parent to fall back to
    assert client.get("/admin/stats").json()["serving"] == 0 and _statuses(client)[worse] == "rolled_back"
    assert [e["kind"] for e in client.get("/admin/events").json()["data"]][-2:] == ["rollback", "guard_rollback"]

    ops.export_versions(rows)
    assert f'liveloop_monitor_reward_rate{{version="{worse}"}} 0.2' in client.get("/metrics").text
    ops.poll()
    drift = client.get("/admin/drift").json()
    assert drift["segments"]["worse"]["n"] == 25 and sum(b["n"] for b in drift["series"]) == 50
    assert all(list(b) == ["t", "n", "positive", "rate", "low", "high"] for b in drift["series"])
    keys = client.get("/admin/keys").json()["data"]
    assert len(keys) == 25 and all(list(k) == ["key_id", "quarantined", "reason", "ratings", "forgotten_at", "disagreement"] for k in keys)


def test_one_key_rating_a_version_down_does_not_roll_it_back(client, tmp_path):
    """The attacker: one key rates 60 replies of the serving version down against an honest parent
    (20 up, 5 down, one key each): one vote of the 5 keys the guard needs, so nothing rolls back."""
    ops = client.app.state.server.operations
    r = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "fine", seed=4))})
    fine = r.json()["version"]
    _rate(client, 0, liked=20, disliked=5, tag="base-again")
    _rate(client, fine, liked=0, disliked=60, tag="attack", keys=1)
    rows = client.portal.call(ops.versions)
    row = {r.version: r for r in rows}[fine]
    assert (row.reward.n, row.reward.successes, row.keys) == (60, 0, 1)
    assert client.portal.call(ops.guard, rows) is None
    assert client.get("/admin/stats").json()["serving"] == fine


def test_the_guard_does_not_undo_what_serves_since_it_judged(client, tmp_path):
    """Compare-and-set: the guard judged `worse`, an operator imported a newer version meanwhile; its
    rollback is refused (the version it judged no longer serves) and the import stays."""
    ops = client.app.state.server.operations
    parent = client.get("/admin/stats").json()["serving"]
    _rate(client, parent, liked=20, disliked=5, tag="cas-parent")
    worse = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "w", seed=3))}).json()["version"]
    _rate(client, worse, liked=5, disliked=20, tag="cas-worse")
    by_version = {r.version: r for r in client.portal.call(ops.versions)}
    c = ops.config
    assert judge(worse, parent, tally_of(by_version[worse]), tally_of(by_version[parent]), c.guard_min_ratings, c.guard_min_keys, c.guard_p_value)
    newer = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "n", seed=5))}).json()["version"]
    assert client.portal.call(ops._guard_lineage, by_version, worse, None) is None
    assert client.get("/admin/stats").json()["serving"] == newer and _statuses(client)[worse] != "rolled_back"



def _model(client: TestClient) -> Path:
    return Path(client.app.state.server.store.versions.get_version(0).checkpoint_path)


def test_two_operators_on_one_view_cannot_undo_each_other(client, tmp_path):
    """Both saw the same version serving and roll back from it: the first goes through, the second is a
    409 serving_changed and changes nothing (without expect_serving it would have served its choice)."""
    a = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "a", seed=5))}).json()["version"]
    b = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "b", seed=6))}).json()["version"]
    seen = client.get("/admin/stats").json()["serving"]
    assert seen == b
    r = client.post("/admin/rollback", json={"version": a, "expect_serving": seen})
    assert r.status_code == 200, r.text
    before = _statuses(client)
    refused = _answer(client.post("/admin/rollback", json={"version": 0, "expect_serving": seen}))
    assert refused == (409, {"error": {
        "message": f"version {seen} no longer serves (now: v{a})", "type": "conflict_error", "param": "expect_serving", "code": "serving_changed",
    }})
    assert _statuses(client) == before and client.get("/admin/stats").json()["serving"] == a
    bad = client.post("/admin/rollback", json={"version": 0, "expect_serving": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "expect_serving"


def test_a_deposed_leaders_guard_rolls_nothing_back(client, tmp_path):
    """Fenced: the guard judges as the leader of a term the store's lease no longer has (here: a term
    nobody holds); its rollback is refused in the store's transaction, the engine swaps back, and the
    same verdict in a live term (0: no lease, unfenced) rolls back."""
    ops = client.app.state.server.operations
    parent = client.get("/admin/stats").json()["serving"]
    _rate(client, parent, liked=20, disliked=5, tag="fence-parent")
    worse = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(_model(client), tmp_path / "f", seed=6))}).json()["version"]
    _rate(client, worse, liked=5, disliked=20, tag="fence-worse")
    leader = ops.leader
    try:
        ops.leader = lambda: 99  # deposed: the store's leader lease is not in term 99
        assert client.portal.call(ops.guard, client.portal.call(ops.versions)) is None
        assert client.get("/admin/stats").json()["serving"] == worse and _statuses(client)[worse] == "serving"
    finally:
        ops.leader = leader
    done = client.portal.call(ops.guard, client.portal.call(ops.versions))
    assert isinstance(done, RollbackResult) and (done.version, done.previous) == (parent, worse)
