"""The admin API's per-segment options on a server without adapters (`[segments] adapters = "none"`, the
default), in-process over the real application (`build_app`: transformers engine on the tiny model,
SQLite): `GET /admin/adapters` answers no segments (never a 404), `?segment=base` lists the base
weights' versions, a segment named in a query or a body is a 404 (`segment_not_found`), a badly typed
one a 400, and the results of requests that name no segment keep exactly the keys they always had."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, USER_KEY, free_port, write_config


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("admin-segments-off")
    port = free_port()
    path, _ = write_config(work, Path(model_dir).resolve(), "hf", port, extra="[monitor]\nenabled = false\n")
    app = build_app(load_config(path), Path(model_dir))
    with TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False) as c:  # a Host the server answers to
        c.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield c


def _not_found(r) -> None:
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("segment_not_found", "segment", "not_found_error")
    assert "'cozy'" in error["message"]


def test_adapters_off_lists_no_segments(client):
    r = client.get("/admin/adapters")
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "adapters", "adapters": "none", "base_version": 0, "segments": []}
    assert client.get("/admin/adapters", headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 403


def test_versions_carry_their_lineage_and_filter_by_it(client):
    everything = client.get("/admin/versions").json()
    assert [(v["version"], v["segment"], v["serving"]) for v in everything["data"]] == [(0, None, True)]
    base = client.get("/admin/versions", params={"segment": "base"}).json()
    assert base == everything  # the base lineage is all there is; no segment keys added
    public = client.get("/v1/versions", headers={"Authorization": f"Bearer {USER_KEY}"}).json()
    assert [(v["version"], v["segment"]) for v in public["data"]] == [(0, None)]
    _not_found(client.get("/admin/versions", params={"segment": "cozy"}))
    r = client.get("/admin/versions", params={"segment": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query.segment", r.text


def test_pause_and_resume_without_a_segment_keep_their_keys(client):
    r = client.post("/admin/learning/pause", json={"reason": "look"})
    assert r.json() == {"object": "learning", "learner": "sao", "paused": True, "changed": True}
    r = client.post("/admin/learning/resume", json={"segment": None})  # an explicit null names no segment
    assert r.json() == {"object": "learning", "learner": "sao", "paused": False, "changed": True}


@pytest.mark.parametrize("path", ["/admin/learning/pause", "/admin/learning/resume"])
def test_pause_of_a_segment_without_adapters(client, path):
    _not_found(client.post(path, json={"segment": "cozy"}))
    for bad in (5, "", ["cozy"], "x" * 300):
        r = client.post(path, json={"segment": bad, "reason": "typed"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "segment", (bad, r.text)
    assert not client.get("/admin/stats").json()["learning_paused"]


def test_rollback_of_a_segment_without_adapters(client):
    _not_found(client.post("/admin/rollback", json={"version": 0, "segment": "cozy"}))
    for bad in (1, "", {"name": "cozy"}):
        r = client.post("/admin/rollback", json={"version": 0, "segment": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "segment", (bad, r.text)
    r = client.post("/admin/rollback", json={"version": 0})  # the plain rollback answers as it always did
    assert r.status_code == 409 and r.json()["error"] == {
        "message": "version 0 is already serving", "type": "conflict_error", "param": "version", "code": None
    }
    # the refusals recorded nothing: the operator log holds the one pause and resume above
    assert [e["kind"] for e in client.get("/admin/events").json()["data"]] == ["pause", "resume"]
