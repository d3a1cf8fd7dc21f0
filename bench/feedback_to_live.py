"""Feedback-to-live latency: from `POST /v1/feedback` to the first response served by a version that
was trained on that rating, on the embedded default shape (vLLM engine + co-located Ray learner,
SQLite), with one user chatting and rating every reply. Also the learner's throughput and idle
fraction while serving runs.

    .venv/bin/python bench/feedback_to_live.py [--seconds 90] [--backend vllm] [--arms today,live] [--think 0]

Arms, one server each, run one after the other in this script:
  today  the former defaults: versions published every 4 steps or 5 s, saved as checkpoint directories
         and swapped in by draining (what this benchmark measured before the memory path);
  live   configs/serve/default.toml's values now (the fast path): a version after every step (adaptive
         batch up to 16 ratings), handed to the engine through shared memory (the durable checkpoint
         written after), swapped in `keep` mode; the learner looks for ratings every 20 ms (not 100)
         and the server for versions every 50 ms (not 100). `--arms live` runs the default alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from common import chat_messages, default_model, percentile, save  # noqa: E402


ARMS = {
    "today": {"publish_every": 4, "publish_seconds": 5.0, "max_batch": 0, "transport": "checkpoint_dir", "swap_mode": "drain",
              "poll": 0.1, "watch": 0.1},
    "live": {"publish_every": 1, "publish_seconds": 0.5, "max_batch": 16, "transport": "shared_memory", "swap_mode": "keep",
             "poll": 0.02, "watch": 0.05},
}


def run_arm(name: str, arm: dict, args: argparse.Namespace, model_dir: Path) -> dict:
    from liveloop.devtools import ADMIN_KEY, USER_KEYS, start_server

    # over the tuned learner preset (configs/fragments/tuned_learner.toml): no pre-trained critic here, so
    # near-Monte-Carlo advantages (alpha = 1), and no KL anchor, as this benchmark has always measured
    learner = (
        f"publish_every_steps = {arm['publish_every']}\npublish_every_seconds = {arm['publish_seconds']}\n"
        f"max_batch_size = {arm['max_batch']}\npoll_seconds = {arm['poll']}\nlambda_alpha = 1.0\nkl_coef = 0.0\n"
    )
    posts: list[tuple[float, int]] = []  # (time of POST /v1/feedback, feedback id)
    served: list[tuple[float, int]] = []  # (time a response completed, its version)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(
            Path(tmp), model_dir, args.backend, learner=learner, extends="tuned_learner",
            engine_extra=f'swap_mode = "{arm["swap_mode"]}"', server_extra=f"watch_seconds = {arm['watch']}", extra=f'[transport]\nbackend = "{arm["transport"]}"\n',
        )
        try:
            # 16 users take turns, each chatting and rating every reply (one key per user: the learner's
            # per-key influence cap sees 16 people, not one)
            user = httpx.Client(base_url=server.base_url, timeout=60)
            auth = [{"Authorization": f"Bearer {key}"} for key in USER_KEYS]
            deadline = time.monotonic() + args.seconds
            i = 0
            while time.monotonic() < deadline:
                r = user.post(
                    "/v1/chat/completions", json={"model": "liveloop-tiny", "messages": chat_messages(i), "max_tokens": 32},
                    headers=auth[i % len(auth)],
                )
                r.raise_for_status()
                served.append((time.monotonic(), r.json()["policy_version"]))
                reward = int("behold" in r.json()["choices"][0]["message"]["content"].lower())
                t = time.monotonic()
                f = user.post("/v1/feedback", json={"response_id": r.json()["id"], "reward": reward}, headers=auth[i % len(auth)])
                f.raise_for_status()
                posts.append((t, f.json()["id"]))
                i += 1
                time.sleep(args.think)
            for _ in range(20):  # keep probing a little so the last ratings can go live
                r = user.post(
                    "/v1/chat/completions", json={"model": "liveloop-tiny", "messages": chat_messages(0), "max_tokens": 8}, headers=auth[0]
                )
                served.append((time.monotonic(), r.json()["policy_version"]))
                time.sleep(0.5)
            versions = user.get("/v1/versions", headers=auth[0], params={"limit": 1000}).json()["data"]
            swaps = _swap_seconds(user.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text)
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
        "arm": name,
        "config": arm | {"backend": args.backend, "seconds": args.seconds, "think": args.think},
        "ratings": len(posts),
        "went_live": len(latencies),
        "not_live_by_end": missing,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "versions_published": len(cursor_of),
        "learner_samples": status.get("samples"),
        "learner_samples_per_busy_s": status.get("samples", 0) / busy if busy else None,
        "learner_idle_fraction": status.get("idle_fraction"),
        "swap_mean_s": swaps,
    }
    return result


def _swap_seconds(metrics: str) -> float | None:
    """The mean of the server's swap times (its Prometheus summary, all label sets together)."""
    total = count = 0.0
    for line in metrics.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name.endswith("server_swap_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif name.endswith("server_swap_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total / count if count else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--arms", default="today,live")
    parser.add_argument("--think", type=float, default=0.0, help="seconds between a rating and the next chat (0: back to back)")
    args = parser.parse_args()
    model_dir = default_model()
    results = [run_arm(name, ARMS[name], args, model_dir) for name in args.arms.split(",")]
    print(f"\n{args.backend} engine, {args.seconds:.0f} s per arm, think time {args.think:g} s")
    print("| arm | ratings | live | feedback-to-live p50 | p99 | versions | mean swap | learner samples/s (busy) | learner idle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['arm']} | {r['ratings']} | {r['went_live']} | {r['p50_s']:.2f} s | {r['p99_s']:.2f} s | "
            f"{r['versions_published']} | {(r['swap_mean_s'] or 0) * 1000:.0f} ms | {r['learner_samples_per_busy_s'] or 0:.1f} | "
            f"{r['learner_idle_fraction']:.2f} |"
        )
    print(f"saved {save(f'feedback_to_live_{args.backend}_think{args.think:g}', {'arms': results})}")


if __name__ == "__main__":
    main()
