"""The evaluation through the real application (`build_app`: hf engine on the tiny model, SQLite, the
release gate in immediate mode with the evaluation on, a small suite): a version an operator publishes
is evaluated off the serving path and stored; `GET /admin/versions/{v}/evaluation` and
`GET /admin/evaluations` serve it, unknown versions and versions not evaluated are clear 404s, and
`liveloop evaluation V` prints it through the client."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from liveloop.app import build_app
from liveloop.clients import LiveloopClient
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, free_port, immediate_evaluation, perturbed_checkpoint, write_config
from liveloop import operator_cli


@pytest.fixture(scope="module")
def client(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("evaluation-api")
    extra = immediate_evaluation(work)
    port = free_port()
    path, _ = write_config(work, Path(model_dir).resolve(), "hf", port, extra=extra)
    app = build_app(load_config(path), Path(model_dir))
    with TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        yield c


def _wait_evaluation(client: TestClient, version: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/admin/versions/{version}/evaluation")
        if r.status_code == 200:
            return r.json()
        assert r.status_code == 404 and r.json()["error"]["code"] == "evaluation_not_found", r.text
        time.sleep(0.5)
    raise AssertionError(f"version {version} was not evaluated within {timeout:g} s")


def test_a_published_version_is_evaluated_and_served(client, tmp_path, model_dir):
    r = client.post("/admin/weights", json={"path": str(perturbed_checkpoint(Path(model_dir), tmp_path / "v", seed=2, scale=0.2))})
    assert r.status_code == 200, r.text
    version = r.json()["version"]
    body = _wait_evaluation(client, version)
    assert body["object"] == "evaluation" and body["version"] == version and body["live_version"] == version  # immediate: gates nothing
    names = [c["name"] for c in body["checks"]]
    assert names == ["length", "repetition", "refusal_rate", "flattery", "sycophancy", "kl_to_base", "kl_to_live", "perplexity"]
    checks = {c["name"]: c for c in body["checks"]}
    assert checks["kl_to_live"]["value"] == 0.0  # against itself
    assert checks["kl_to_base"]["base"] == 0.0 and checks["kl_to_base"]["value"] != 0.0  # it moved from the base
    assert checks["perplexity"]["value"] > 0 and checks["perplexity"]["base"] > 0
    assert body["failed"] == [c["name"] for c in body["checks"] if not c["passed"]] and body["passed"] == (not body["failed"])
    assert body["seconds"] >= body["engine_seconds"] > 0

    listed = client.get("/admin/evaluations").json()["data"]
    assert [e["version"] for e in listed] == [version] and listed[0] == body


def test_unknown_and_unevaluated_versions_are_404s(client):
    r = client.get("/admin/versions/999/evaluation")
    assert r.status_code == 404 and r.json()["error"]["code"] == "version_not_found" and r.json()["error"]["param"] == "version"
    r = client.get("/admin/versions/0/evaluation")  # the base model: nothing learned to evaluate
    assert r.status_code == 404 and r.json()["error"]["code"] == "evaluation_not_found"
    assert "not been evaluated" in r.json()["error"]["message"]
    assert client.get("/admin/versions/-1/evaluation").status_code == 400
    assert client.get("/admin/versions/abc/evaluation").status_code == 400
    assert client.get("/admin/evaluations", params={"limit": 0}).status_code == 400
    assert client.get("/admin/versions/0/evaluation", headers={"Authorization": "Bearer nope"}).status_code == 401


class _InProcess(LiveloopClient):
    """The real client over the in-process application."""

    def __init__(self, http: TestClient):
        self.http, self._model = http, None

    def close(self) -> None:
        pass


def test_the_cli_prints_the_evaluation(client, monkeypatch, capsys):
    version = max(e["version"] for e in client.get("/admin/evaluations").json()["data"])
    monkeypatch.setattr(operator_cli, "_admin_client", lambda args: _InProcess(client))
    parser_args = type("A", (), {"version": version, "json": False})()
    assert operator_cli.cmd_evaluation(parser_args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"v{version} against live v{version}: ") and "kl_to_base" in out and "perplexity" in out
    with pytest.raises(SystemExit):
        operator_cli.cmd_evaluation(type("A", (), {"version": 999, "json": False})())
    assert "no policy version 999" in capsys.readouterr().err
