"""The automatic guard per segment on a real server (hf engine, SQLite, `[learner] adapters =
"segment"`, the learner off): a segment's new adapter version that its users rate significantly worse
than the adapter before it is rolled back to that one, without an operator, and no other lineage moves."""

from __future__ import annotations

import time

import httpx

from liveloop.checkpoint import checkpoint_digest
from liveloop.devtools import wait_until

from liveloop.devtools import USER_KEYS

from .conftest import ADMIN_KEY, USER_KEY, open_store, start_server, stop_server
from .test_segment_adapters_api import _save_adapter

ADMIN, USER = {"Authorization": f"Bearer {ADMIN_KEY}"}, {"Authorization": f"Bearer {USER_KEY}"}
SEGMENTS = 'adapters = "segment"\nnames = ["cozy", "night"]\n'  # [segments]
EXTRA = """[monitor]
poll_seconds = 0.2
guard = true
guard_min_ratings = 25
guard_p_value = 0.01
"""


def test_guard_rolls_back_a_segments_worse_adapter_only(tmp_path, model_dir):
    adapters = {name: _save_adapter(model_dir, tmp_path / name, seed) for name, seed in (("a", 1), ("b", 2), ("n", 3))}
    server = start_server(tmp_path / "srv", model_dir, "hf", segments=SEGMENTS, extra=EXTRA)
    store = open_store(server)
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            def serving() -> dict:
                return {s["segment"]: s["serving"] for s in http.get("/admin/adapters", headers=ADMIN).json()["segments"]}

            def publish(name: str, segment: str, parent: int) -> int:
                version = store.versions.publish_version(  # the number is allocated in the inserting transaction
                    parent=parent, checkpoint_path=str(adapters[name]), checkpoint_sha256=checkpoint_digest(adapters[name]),
                    learner_step=1, samples_used=1, metrics={}, cursor_name=f"sao:{segment}", last_feedback_id=0, segment=segment,
                ).version
                wait_until(lambda: serving()[segment] == version, 30, f"{segment}'s version {version} activated")
                return version

            def rate(segment: str, n: int, reward: int) -> None:
                for i in range(n):
                    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2,
                            "metadata": {"segment": segment}}
                    user = {"Authorization": f"Bearer {USER_KEYS[i % len(USER_KEYS)]}"}  # the guard counts one vote per key
                    reply = http.post("/v1/chat/completions", headers=user, json=body).json()
                    assert http.post("/v1/feedback", headers=user, json={"response_id": reply["id"], "reward": reward}).status_code == 200

            first = publish("a", "cozy", 0)
            night = publish("n", "night", 0)
            rate("cozy", 30, 1)  # cozy's first adapter: liked
            worse = publish("b", "cozy", first)
            rate("night", 30, 0)  # night's only adapter is disliked too, but has no adapter parent to judge against
            rate("cozy", 25, 0)
            wait_until(lambda: serving()["cozy"] == first, 30, "the guard rolled cozy back")
            time.sleep(1.0)
            assert serving() == {"cozy": first, "night": night, "overflow": None}
            versions = {v["version"]: v for v in http.get("/admin/versions", headers=ADMIN).json()["data"]}
            assert versions[worse]["status"] == "rolled_back" and versions[night]["status"] == "serving"
            assert versions[0]["status"] == "serving"
            guards = [e for e in http.get("/admin/events", headers=ADMIN).json()["data"] if e["kind"] == "guard_rollback"]
            assert [(e["version"], e["detail"]["segment"]) for e in guards] == [(first, "cozy")]
    finally:
        store.close()
        stop_server(server)
