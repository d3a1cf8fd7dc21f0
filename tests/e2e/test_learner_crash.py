"""Kill the learner process mid-run (SIGKILL), restart it: every rated response is consumed exactly
once (cursor + version lineage) and serving never stops. The learner runs apart from the server
(`liveloop learn`), as operators who separate them do; the server swaps in what it publishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx

from liveloop.devtools import wait_until

from .conftest import ADMIN_KEY, USER_KEY, open_store, start_server, stop_server

N_RATED = 24
LEARNER_STATUSES = ("published", "serving", "retired", "superseded")


def _learn(config) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), "learn"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=config.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )



def test_killed_learner_resumes_exactly_once(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf")
    config = tmp_path / "srv" / "config.toml"
    headers = {"Authorization": f"Bearer {USER_KEY}"}
    chat = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about the moon."}], "max_tokens": 24}
    http = httpx.Client(base_url=server.base_url, headers=headers, timeout=60)
    for i in range(N_RATED):
        rid = http.post("/v1/chat/completions", json=chat | {"seed": i}).json()["id"]
        assert http.post("/v1/feedback", json={"response_id": rid, "reward": i % 2}).status_code == 200

    failures, served, stop = [], [], threading.Event()

    def users() -> None:  # serving must go on while the learner dies and comes back
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/v1/chat/completions", json=chat)
                (served if r.status_code == 200 else failures).append(r.status_code)

    t = threading.Thread(target=users)
    t.start()
    store = open_store(server)
    try:
        first = _learn(config)
        wait_until(lambda: store.versions.cursor_version("sao") not in (None, 0), 180, "a first published version")
        os.killpg(first.pid, signal.SIGKILL)  # mid-run: steps after the last version are lost in memory
        first.wait(30)
        killed_at = store.feedback.get_cursor("sao")
        assert 0 < killed_at < N_RATED * 2  # feedback ids start at 1
        second = _learn(config)
        last_id = max(f.id for f, _ in store.feedback.rated_after(0, 1000))
        wait_until(lambda: store.feedback.get_cursor("sao") == last_id, 240, "the restarted learner to consume every rating")
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(60)
        wait_until(lambda: http.get("/healthz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["policy_version"] == store.versions.cursor_version("sao"), 60, "the server to swap in the last version")
    finally:
        stop.set()
        t.join(60)
        http.close()
        stop_server(server)
    versions = [v for v in store.versions.list_versions() if v.status in LEARNER_STATUSES and v.version > 0]
    assert sum(v.samples_used for v in versions) == N_RATED, "every rating trained exactly once"
    assert [v.parent for v in versions] == [0] + [v.version for v in versions[:-1]], "one unbroken lineage"
    assert not failures and len(served) > 0
    store.close()
