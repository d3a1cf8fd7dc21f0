"""The automatic guard on a real server (transformers engine, SQLite): a new version whose users rate
it significantly worse than its parent is rolled back without an operator; one key rating it down,
however often, is one vote and rolls nothing back."""

from __future__ import annotations

import time

import httpx

from liveloop.devtools import USER_KEYS, perturbed_checkpoint

from .conftest import ADMIN_KEY, USER_KEY, start_server, stop_server

GUARD = """
[monitor]
poll_seconds = 0.2
guard = true
guard_min_ratings = 25
guard_p_value = 0.01
"""


def test_guard_rolls_back_a_significantly_worse_version(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf", extra=GUARD)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            def rate_some(n: int, reward: int, keys: tuple[str, ...] = USER_KEYS) -> None:
                for i in range(n):
                    by = {"Authorization": f"Bearer {keys[i % len(keys)]}"}
                    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2}
                    reply = http.post("/v1/chat/completions", headers=by, json=body).json()
                    assert http.post("/v1/feedback", headers=by, json={"response_id": reply["id"], "reward": reward}).status_code == 200

            rate_some(30, 1)  # version 0: liked, by 16 keys
            swapped = http.post("/admin/weights", headers=admin, json={"path": str(perturbed_checkpoint(model_dir, tmp_path / "v1"))})
            assert swapped.json()["version"] == 1
            rate_some(40, 0, keys=(USER_KEY,))  # the attacker: one key, 40 thumbs down: one vote of the 5 keys needed
            time.sleep(1.5)
            assert http.get("/admin/stats", headers=admin).json()["serving"] == 1
            rate_some(4, 0, keys=USER_KEYS[1:5])  # four more keys: 5 in all, all down against 16 keys that liked 0
            rate_some(1, 0, keys=USER_KEYS[5:6])
            deadline = time.monotonic() + 120  # a hang guard, not a speed verdict
            while http.get("/admin/stats", headers=admin).json()["serving"] != 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            versions = {v["version"]: v for v in http.get("/admin/versions", headers=admin).json()["data"]}
            assert versions[0]["serving"] and versions[1]["status"] == "rolled_back"
            kinds = [e["kind"] for e in http.get("/admin/events", headers=admin).json()["data"]]
            assert "guard_rollback" in kinds and "rollback" in kinds
    finally:
        stop_server(server)
