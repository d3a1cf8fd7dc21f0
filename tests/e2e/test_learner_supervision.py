"""The co-located learner dies (its Ray worker is SIGKILLed): the server keeps serving and logging,
/healthz and /admin/learner report the outage, an operator event records the crash, and the learner
comes back from its last published version and trains the ratings that arrived meanwhile."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from liveloop.devtools import wait_until

from .conftest import ADMIN_KEY, USER_KEY, learner_worker, open_store, start_server, stop_server

pytestmark = pytest.mark.slow
# over the tuned learner preset (configs/fragments/tuned_learner.toml): publish after every step; no pre-trained
# critic here, so near-Monte-Carlo advantages (alpha = 1), and no KL anchor (no reference model to load)
PRESET = "tuned_learner"
LEARNER = """
publish_every_steps = 1
publish_every_seconds = 1.0
poll_seconds = 0.1
lambda_alpha = 1.0
kl_coef = 0.0
"""
MSG = [{"role": "user", "content": "Tell me about the moon."}]



def _rate(c: httpx.Client, n: int) -> list[str]:
    ids = []
    for i in range(n):
        rid = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 8}).json()["id"]
        assert c.post("/v1/feedback", json={"response_id": rid, "reward": i % 2}).status_code == 200
        ids.append(rid)
    return ids


def test_learner_crash_is_reported_and_recovered(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf", learner=LEARNER, extends=PRESET)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60) as c:
            _rate(c, 2)
            store = open_store(server)
            wait_until(lambda: store.feedback.get_cursor("sao") >= 2, 180, "the learner to train the first ratings")
            worker = wait_until(lambda: learner_worker(server), 30, "the learner's Ray worker")
            os.kill(worker.pid, signal.SIGKILL)
            # serving and logging go on; the health says the learner is not running
            seen = wait_until(lambda: httpx.get(server.base_url + "/healthz", headers=admin, timeout=10).json()["learner"]["state"] != "running"
                         and httpx.get(server.base_url + "/healthz", headers=admin, timeout=10), 60, "the outage to show")
            assert seen.status_code == 200 and seen.json()["status"] == "degraded"
            late = _rate(c, 3)
            wait_until(lambda: httpx.get(server.base_url + "/healthz", headers=admin, timeout=10).json()["learner"]["state"] == "running", 300, "the restart")
            kinds = [e["kind"] for e in c.get("/admin/events", headers=admin).json()["data"]]
            assert "learner_crash" in kinds and "learner_restart" in kinds
            status = c.get("/admin/learner", headers=admin).json()
            assert status["running"] and status["restarts"] == 1
            last = max(f.id for f, _ in store.feedback.rated_after(0, 1000))
            wait_until(lambda: store.feedback.get_cursor("sao") >= last, 300, "the restarted learner to train the late ratings")
            assert all(store.feedback.get_response(rid) is not None for rid in late)
            store.close()
    finally:
        stop_server(server)
