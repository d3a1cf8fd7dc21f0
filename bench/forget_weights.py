"""Forget-to-weights wall clock against the number of ratings replayed: `POST /admin/keys/{id}/forget`
with `weights: true`, from the request to the first served version of the retrained lineage whose
training reached where the learner was (every other key's rating since the key's first trained one
replayed), on the tiny model (hf engine, co-located Ray learner, the tuned preset, SQLite).

    .venv/bin/python bench/forget_weights.py [--sizes 32,96,192] [--backend hf]

One server; for each size R in turn: a fresh key rates one reply, then another key rates R replies;
once the learner has published and the server serves a version past all of them, the fresh key is
forgotten with weights (after a dry run, whose plan and estimate are recorded). Reported per size: the
plan's replayed ratings and estimate, the POST's own time (plan, deletion, rollback swap) and the wall
clock until the retrained lineage serves. Results in bench/results/forget_weights.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from common import chat_messages, default_model, save  # noqa: E402

LEARNER = "lambda_alpha = 1.0\npublish_every_steps = 4\n"
CONCURRENCY = 8


async def _rate(client: httpx.AsyncClient, key: str, n: int, seed: int) -> int:
    """`n` replies to `key`, each rated (1 when it has "verily"); returns the last rating's id."""
    last = 0
    headers = {"Authorization": f"Bearer {key}"}
    for start in range(0, n, CONCURRENCY):
        replies = await asyncio.gather(*[
            client.post("/v1/chat/completions", headers=headers,
                        json={"model": "liveloop-tiny", "messages": chat_messages(i), "max_tokens": 32, "seed": seed + i})
            for i in range(start, min(n, start + CONCURRENCY))
        ])
        for r in replies:
            body = r.raise_for_status().json()
            reward = int("verily" in body["choices"][0]["message"]["content"].lower())
            fb = await client.post("/v1/feedback", headers=headers, json={"response_id": body["id"], "reward": reward})
            last = fb.raise_for_status().json()["id"]
    return last


def _wait_served(store, at_least: int, newer_than: int, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        serving = store.versions.latest_version()
        if serving.version > newer_than and serving.metrics.get("learner/cursor", 0) >= at_least:
            return serving.version
        time.sleep(0.1)
    raise RuntimeError(f"no version past {newer_than} reached rating {at_least} in {timeout} s")


async def run(args: argparse.Namespace, model_dir: Path) -> list[dict]:
    from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEYS, start_server
    from liveloop.server.edge.auth import key_digest
    from liveloop.store import Store, StoreConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), model_dir, args.backend, learner=LEARNER, extends="tuned_learner")
        store = Store(StoreConfig(url=server.store_url))
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
                admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
                seed = 0
                for i, size in enumerate(args.sizes):
                    planted = USER_KEYS[3 + i]
                    await _rate(client, planted, 1, seed)
                    last = await _rate(client, USER_KEY, size, seed + 1)
                    seed += size + 1
                    await asyncio.to_thread(_wait_served, store, last, 0)
                    url = f"/admin/keys/{key_digest(planted)[:16]}/forget"
                    plan = (await client.post(url, headers=admin, json={"weights": True, "dry_run": True})).raise_for_status().json()
                    lineage = plan["lineages"][0]
                    start = time.perf_counter()
                    (await client.post(url, headers=admin, json={"weights": True})).raise_for_status()
                    post_s = time.perf_counter() - start
                    await asyncio.to_thread(_wait_served, store, lineage["head_cursor"], max(lineage["affected"]))
                    wall = time.perf_counter() - start
                    row = {
                        "size": size, "replayed": plan["replay"], "versions_rolled_back": len(lineage["affected"]),
                        "estimate_seconds": plan["estimate_seconds"], "post_seconds": round(post_s, 3), "wall_seconds": round(wall, 2),
                        "replayed_per_second": round(plan["replay"] / wall, 2) if wall else None,
                    }
                    print(row, flush=True)
                    rows.append(row)
        finally:
            store.close()
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[32, 96, 192])
    parser.add_argument("--backend", default="hf")
    args = parser.parse_args()
    model_dir = default_model()
    rows = asyncio.run(run(args, model_dir))
    path = save("forget_weights", {"backend": args.backend, "sizes": args.sizes, "rows": rows}, model_dir)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
