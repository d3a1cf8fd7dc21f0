"""The loop closed offline, as an operator runs it: a real `liveloop serve` (hf, tiny model, SQLite,
no online learner) serves and logs rated chat replies; `liveloop store export --shape kto` (the real
command, reading the server's config) writes them as Parquet; `liveloop offline kto` trains two TRL KTO
steps on it; `POST /admin/weights` imports the checkpoint with the job's lineage note; the new version
then serves, its note is visible in /v1/versions, and a rating of its reply is accepted. A request with
`store: false` is never exported."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pyarrow.parquet as pq
import pytest

from .conftest import ADMIN_KEY, USER_KEY, start_server, stop_server

pytestmark = pytest.mark.slow

PROMPTS = ["Tell me about trains.", "What do you think of rain?", "Say something kind."]


def _cli(*args: str, timeout: float = 300) -> dict:
    done = subprocess.run([sys.executable, "-m", "liveloop.cli", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_export_train_import_serve_rate(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("offline-kto")
    server = start_server(work / "server", model_dir, "hf")
    user = {"Authorization": f"Bearer {USER_KEY}"}
    try:
        with httpx.Client(base_url=server.base_url, headers=user, timeout=120) as http:
            def chat(prompt: str, **extra) -> dict:
                body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 12, **extra}
                r = http.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()

            rated = {}
            for k in range(6):
                reply = chat(PROMPTS[k % 3], seed=k)
                reward = k % 2
                assert http.post("/v1/feedback", json={"response_id": reply["id"], "reward": reward}).status_code == 200
                rated[reply["id"]] = bool(reward)
            unstored = chat("Do not keep this one.", store=False)["id"]

            data = work / "kto.parquet"
            exported = _cli("--config", str(work / "server" / "config.toml"), "store", "export", "--shape", "kto", "--format", "parquet",
                            "--out", str(data), "--model", str(model_dir))
            assert exported["rows"] == 6
            table = pq.read_table(data).to_pylist()
            assert {r["response_id"]: r["label"] for r in table} == rated and unstored not in {r["response_id"] for r in table}
            assert {r["prompt"][0]["content"] for r in table} == set(PROMPTS)

            trained = _cli("offline", "kto", "--data", str(data), "--model", str(model_dir), "--out", str(work / "kto-out"),
                           "--steps", "2", "--batch-size", "4", "--lr", "1e-5")
            assert trained["rows"] == 6 and (work / "kto-out" / "model.safetensors").is_file()
            lineage = json.loads((work / "kto-out" / "liveloop_offline.json").read_text())
            assert lineage["method"] == "kto" and lineage["export"]["rows"] == 6 and lineage["steps"] == 2

            imported = http.post("/admin/weights", json={"path": str(work / "kto-out"), "note": trained["note"]},
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            assert imported.status_code == 200, imported.text
            version = imported.json()["version"]
            assert version == 1 and imported.json()["parent"] == 0

            reply = chat(PROMPTS[0])
            assert reply["policy_version"] == version
            rows = {v["version"]: v for v in http.get("/v1/versions").json()["data"]}
            assert rows[version]["note"] == trained["note"] and "offline kto" in rows[version]["note"]
            assert http.post("/v1/feedback", json={"response_id": reply["id"], "reward": 1}).status_code == 200
    finally:
        stop_server(server)
