"""Feedback-to-live latency: from `POST /v1/feedback` to the first response served by a version that
was trained on that rating, on the embedded default shape (vLLM engine + co-located Ray learner,
SQLite), with one user chatting and rating every reply. Also the learner's throughput and idle
fraction while serving runs.

    .venv/bin/python bench/feedback_to_live.py [--seconds 90] [--publish-every 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from common import chat_messages, default_model, percentile, save  # noqa: E402


def main() -> None:
    from liveloop.devtools import ADMIN_KEY, USER_KEY, start_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--publish-every", type=int, default=4)
    parser.add_argument("--publish-seconds", type=float, default=5.0)
    args = parser.parse_args()
    # over the tuned learner preset (configs/tuned_learner.toml): no pre-trained critic here, so
    # near-Monte-Carlo advantages (alpha = 1), and no KL anchor, as this benchmark has always measured
    learner = (
        f"publish_every_steps = {args.publish_every}\npublish_every_seconds = {args.publish_seconds}\n"
        "lambda_alpha = 1.0\nkl_coef = 0.0\n"
    )
    model_dir = default_model()
    posts: list[tuple[float, int]] = []  # (time of POST /v1/feedback, feedback id)
    served: list[tuple[float, int]] = []  # (time a response completed, its version)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), model_dir, "vllm", learner=learner, extends="tuned_learner")
        try:
            user = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60)
            deadline = time.monotonic() + args.seconds
            i = 0
            while time.monotonic() < deadline:
                r = user.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": chat_messages(i), "max_tokens": 32})
                r.raise_for_status()
                served.append((time.monotonic(), r.json()["policy_version"]))
                reward = int("behold" in r.json()["choices"][0]["message"]["content"].lower())
                t = time.monotonic()
                f = user.post("/v1/feedback", json={"response_id": r.json()["id"], "reward": reward})
                f.raise_for_status()
                posts.append((t, f.json()["id"]))
                i += 1
            for _ in range(20):  # keep probing a little so the last ratings can go live
                r = user.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": chat_messages(0), "max_tokens": 8})
                served.append((time.monotonic(), r.json()["policy_version"]))
                time.sleep(0.5)
            versions = user.get("/v1/versions").json()["data"]
            status = user.get("/admin/learner", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
            user.close()
        finally:
            server.stop()
    cursor_of = {v["version"]: v["metrics"].get("learner/cursor", 0) for v in versions if v["version"] > 0}
    latencies, missing = [], 0
    for t_post, fid in posts:
        trained_in = [v for v, c in cursor_of.items() if c >= fid]
        if not trained_in:
            missing += 1
            continue
        v_f = min(trained_in)
        live = [t for t, v in served if t >= t_post and v >= v_f]
        if live:
            latencies.append(min(live) - t_post)
        else:
            missing += 1
    busy, idle = status.get("busy_seconds", 0.0), status.get("idle_seconds", 0.0)
    result = {
        "config": vars(args),
        "ratings": len(posts),
        "went_live": len(latencies),
        "not_live_by_end": missing,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "versions_published": len(cursor_of),
        "learner_samples": status.get("samples"),
        "learner_samples_per_busy_s": status.get("samples", 0) / busy if busy else None,
        "learner_idle_fraction": status.get("idle_fraction"),
    }
    print(f"| ratings | live | feedback-to-live p50 | p99 | versions | learner samples/s (busy) | learner idle |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {result['ratings']} | {result['went_live']} | {result['p50_s']:.2f} s | {result['p99_s']:.2f} s | "
        f"{result['versions_published']} | {result['learner_samples_per_busy_s'] or 0:.1f} | {result['learner_idle_fraction']:.2f} |"
    )
    print(f"saved {save('feedback_to_live', result)}")


if __name__ == "__main__":
    main()
