"""Replicas on Ray Serve: push-to-all-replicas latency and serving throughput, side by side, one
deployment after the other in this script (hf engine, the tiny model, PostgreSQL, the learner off so
that only serving competes for the CPUs).

    export PGPASSFILE=$(bash scripts/postgres.sh passfile)   # the cluster's password (scripts/postgres.sh start)
    LIVELOOP_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:55432/liveloop_test \\
        .venv/bin/python bench/replicas.py [--arms process,1,2] [--users 8] [--seconds 20] [--pushes 12]

Arms: `process` is a plain `liveloop serve` (uvicorn, one engine, no Ray); `N` is `liveloop serve`
with `configs/serve/ray.toml` and `[ray] replicas = N` (Serve's proxy in front, N engines).

- throughput: `--users` threads chat back to back (64 tokens, non-streaming) for `--seconds`:
  requests/s, completion tokens/s, latency p50/p99, which replicas answered;
- push-to-all: `--pushes` versions published into the store as a learner does (a row on the serving
  version, its checkpoint directory; two perturbed copies of the model, alternating), idle, one every
  second: the time from the row's commit to the first replica serving it (its activation) and to the
  last (the followers), read from the replica registry every 5 ms (each replica writes its row as
  soon as it serves a new version, looked at every `[server] watch_seconds` = 50 ms).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from common import chat_messages, default_model, percentile, save  # noqa: E402

FLEET = """
[ray]
replicas = {n}
replica_cpus = {cpus}
[monitor]
enabled = false
"""


def _database(base: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


def _drop(base: str, url: str) -> None:
    import psycopg

    with psycopg.connect(base.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


def throughput(base_url: str, users: int, seconds: float) -> dict:
    from liveloop.devtools import USER_KEYS

    latencies: list[float] = []
    tokens, replicas, errors = [0], {}, [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def user(u: int) -> None:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {USER_KEYS[u % len(USER_KEYS)]}"}, timeout=120) as client:
            i = 0
            while time.monotonic() < deadline:
                start = time.perf_counter()
                r = client.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": chat_messages(u * 1000 + i),
                                                              "max_tokens": 64, "temperature": 1.0})
                elapsed = time.perf_counter() - start
                i += 1
                with lock:
                    if r.status_code != 200:
                        errors[0] += 1
                        continue
                    latencies.append(elapsed)
                    tokens[0] += r.json()["usage"]["completion_tokens"]
                    name = r.headers.get("x-liveloop-replica", "?")
                    replicas[name] = replicas.get(name, 0) + 1

    started = time.monotonic()
    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    return {
        "requests": len(latencies), "errors": errors[0], "requests_per_s": len(latencies) / wall, "tokens_per_s": tokens[0] / wall,
        "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99), "by_replica": replicas,
    }


def pushes(store_url: str, checkpoints: list[Path], n_replicas: int, count: int) -> dict:
    from liveloop.store import Store, StoreConfig
    from liveloop.store.replicas import ReplicaRegistry

    store = Store(StoreConfig(url=store_url))
    registry = store.fleet.registry
    first, last = [], []
    try:
        for i in range(count):
            serving = store.versions.latest_version().version
            committed = time.perf_counter()
            version = store.versions.publish_version(
                parent=serving, checkpoint_path=str(checkpoints[i % 2]), checkpoint_sha256=None, learner_step=i, samples_used=0,
                metrics={}, cursor_name="bench", last_feedback_id=0,
            ).version
            committed = time.perf_counter()
            seen: dict[str, float] = {}
            deadline = committed + 30
            while len(seen) < n_replicas and time.perf_counter() < deadline:
                for r in registry.rows(down_after=5.0):
                    if r.up and r.serving_version == version and r.replica_id not in seen:
                        seen[r.replica_id] = time.perf_counter() - committed
                time.sleep(0.005)
            if len(seen) < n_replicas:
                raise RuntimeError(f"version {version} reached {len(seen)} of {n_replicas} replicas in 30 s")
            first.append(min(seen.values()))
            last.append(max(seen.values()))
            time.sleep(1.0)
    finally:
        store.close()
    ms = lambda xs, q: round(1000 * percentile(xs, q), 1)  # noqa: E731
    return {"pushes": count, "first_p50_ms": ms(first, 50), "first_p99_ms": ms(first, 99), "all_p50_ms": ms(last, 50), "all_p99_ms": ms(last, 99)}


def run_arm(arm: str, args: argparse.Namespace, model_dir: Path, checkpoints: list[Path]) -> dict:
    from liveloop.devtools import start_server

    base = os.environ["LIVELOOP_TEST_PG_URL"]
    url = _database(base)
    n = 1 if arm == "process" else int(arm)
    extra = "[monitor]\nenabled = false\n" if arm == "process" else FLEET.format(n=n, cpus=min(0.5, 2 / n))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            server = start_server(Path(tmp), model_dir, "hf", learner=None, extra=extra, store_url=url, extends=["ray", "tiny"] if arm != "process" else None,
                                  timeout=600, server_extra="watch_seconds = 0.05")
            up = time.monotonic() - started
            try:
                from liveloop.devtools import wait_until
                from liveloop.store import Store, StoreConfig
                from liveloop.store.replicas import ReplicaRegistry

                store = Store(StoreConfig(url=url))
                wait_until(lambda: sum(r.up for r in store.fleet.registry.rows(5.0)) == n, 120, f"{n} replicas registered")
                store.close()
                throughput(server.base_url, 2, 3.0)  # warm-up
                result = {"arm": arm, "replicas": n, "start_s": round(up, 1)}
                result |= throughput(server.base_url, args.users, args.seconds)
                result |= pushes(url, checkpoints, n, args.pushes)
                print(result, flush=True)
                return result
            finally:
                server.stop()
    finally:
        _drop(base, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="process,1,2", help="process (plain liveloop serve) and/or replica counts")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pushes", type=int, default=12)
    args = parser.parse_args()
    if not os.environ.get("LIVELOOP_TEST_PG_URL"):
        raise SystemExit("set LIVELOOP_TEST_PG_URL (a PostgreSQL cluster this script may create databases in)")
    from liveloop.devtools import perturbed_checkpoint

    model_dir = default_model()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = [perturbed_checkpoint(model_dir, Path(tmp) / f"c{seed}", seed=seed) for seed in (1, 2)]
        results = [run_arm(arm, args, model_dir, checkpoints) for arm in args.arms.split(",")]
    path = save("replicas", {"args": vars(args), "arms": results}, model_dir)
    print(f"{'arm':>8} {'req/s':>7} {'tok/s':>7} {'p50 s':>6} {'p99 s':>6} {'push first p50/p99 ms':>22} {'push all p50/p99 ms':>20}")
    for r in results:
        print(f"{r['arm']:>8} {r['requests_per_s']:7.2f} {r['tokens_per_s']:7.1f} {r['latency_p50_s']:6.2f} {r['latency_p99_s']:6.2f} "
              f"{r['first_p50_ms']:>10} / {r['first_p99_ms']:<9} {r['all_p50_ms']:>9} / {r['all_p99_ms']:<9}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
