"""One LoRA adapter for everyone (`[segments] adapters = "shared"`, the cheap update path for a model too
large to train whole) through the whole loop: the real server (hf engine) and co-located learner. Every
request is served by the shared adapter once its lane publishes, whatever segment it names, and the
base weights never change."""

from __future__ import annotations

import httpx

from liveloop.devtools import wait_until

from .conftest import ADMIN_KEY, USER_KEY, open_store, start_server, stop_server

ADMIN, USER = {"Authorization": f"Bearer {ADMIN_KEY}"}, {"Authorization": f"Bearer {USER_KEY}"}


def test_one_adapter_serves_and_learns_for_everyone(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf", learner="", segments='adapters = "shared"', extends="tuned_learner")
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            def ask(i: int, segment: str | None) -> dict:
                body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me about rain {i}."}],
                        "max_tokens": 8, "seed": i, **({"metadata": {"segment": segment}} if segment else {})}
                r = http.post("/v1/chat/completions", headers=USER, json=body)
                assert r.status_code == 200, r.text
                return r.json()

            last = 0
            for i in range(12):
                reply = ask(i, "cozy" if i % 2 else None)
                r = http.post("/v1/feedback", headers=USER, json={"response_id": reply["id"], "reward": i % 2})
                assert r.status_code == 200
                last = r.json()["id"]

            def shared_version():
                body = http.get("/admin/adapters", headers=ADMIN).json()
                assert body["adapters"] == "shared" and [s["segment"] for s in body["segments"]] == ["shared"]
                return body["segments"][0]["serving"]

            def settled():
                """Every rating trained and published, and that last version serving: nothing moves now."""
                lane = http.get("/admin/learner", headers=ADMIN).json()["segments"]["shared"]
                serving = shared_version()
                return serving if lane["cursor"] >= last and serving == lane["version"] else None

            version = wait_until(settled, 120, "the shared adapter's last version activated")
            metrics = http.get("/metrics", headers=ADMIN)  # a learner of lanes: its totals, no one version
            assert metrics.status_code == 200 and "liveloop_learner_step " in metrics.text
            assert "liveloop_learner_version " not in metrics.text
            # ... and each lane's own figures, by its segment (the trust region's refusals among them)
            assert f'liveloop_lane_version{{segment="shared"}} {float(version)}' in metrics.text
            assert 'liveloop_lane_learner_rejected_steps{segment="shared"}' in metrics.text
            served = [ask(100 + i, segment)["policy_version"] for i, segment in enumerate(("cozy", "night", None))]
            assert served == [version] * 3
        store = open_store(server)
        try:
            assert {r.segment for r in store.versions.list_versions()} == {None, "shared"}
            assert store.versions.latest_version().version == 0  # the base weights did not move
            assert {r.segment for _, r in store.feedback.rated_after(0, 100)} == {"shared"}
        finally:
            store.close()
    finally:
        stop_server(server)
