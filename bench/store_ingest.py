"""Store ingest throughput: served responses plus feedback rows written per second, through liveloop's
real store code, on SQLite and PostgreSQL.

Two ways of writing the same workload, each into a fresh database:
  baseline  one transaction per operation: `store.write_batch([op])` in a loop, one caller;
  writer    liveloop's group-commit `BatchWriter`, fed by T threads that each behave like an HTTP
            handler: submit a record and wait for its future (the commit) before the next request.
The workload is N responses (64 prompt tokens, 128 response tokens, random ids < 1024, float32
logprobs), about half of them followed by a rating from the same API key once the response is
committed. Each measurement is repeated, alternating baseline and writer, and the median reported.

    .venv/bin/python bench/store_ingest.py                     # SQLite and PostgreSQL, default sizes
    .venv/bin/python bench/store_ingest.py --no-postgres --responses 1000 --repeats 2

PostgreSQL comes from scripts/postgres.sh (or LIVELOOP_TEST_PG_URL); each run gets its own database,
dropped afterwards. Prints a Markdown table and writes bench/results/store_ingest.json.
Needs no torch and no model: the store knows nothing of either.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import sqlalchemy

from liveloop.store import BatchWriter, FeedbackRecord, ResponseRecord, Store, StoreConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "store_ingest.json"

DEFAULT_RESPONSES = {"sqlite": 4000, "postgresql": 2000}
PROMPT_TOKENS = 64
RESPONSE_TOKENS = 128
VOCAB = 1024
FEEDBACK_FRACTION = 0.5
API_KEYS = 16

# One request's worth of work: a response and, for about half of them, the rating that follows it.
Request = tuple[ResponseRecord, FeedbackRecord | None]


@dataclass
class Run:
    backend: str
    mode: str  # "baseline" | "writer"
    repeat: int
    responses: int
    feedback: int
    seconds: float
    commits: int

    @property
    def rows(self) -> int:
        return self.responses + self.feedback

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


# -- workload ---------------------------------------------------------------------------------
def make_workload(n_responses: int, seed: int) -> list[Request]:
    """N responses shaped like a small chat completion; built before any timing starts."""
    rng = np.random.default_rng(seed)
    requests: list[Request] = []
    for i in range(n_responses):
        key = f"key-{i % API_KEYS}"
        response = ResponseRecord(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            api_key_id=key,
            model="bench",
            policy_version=0,
            endpoint="chat",
            prompt_ids=tuple(rng.integers(0, VOCAB, PROMPT_TOKENS).tolist()),
            response_ids=tuple(rng.integers(0, VOCAB, RESPONSE_TOKENS).tolist()),
            behavior_logprobs=tuple((-rng.exponential(1.0, RESPONSE_TOKENS)).astype(np.float32).tolist()),
            finish_reason="length",
            temperature=1.0,
            top_p=1.0,
            latency_ms=float(rng.uniform(50, 500)),
            seed=None,
            ttft_ms=float(rng.uniform(5, 50)),
        )
        feedback = None
        if rng.random() < FEEDBACK_FRACTION:
            feedback = FeedbackRecord(response_id=response.id, api_key_id=key, reward=int(rng.integers(0, 2)))
        requests.append((response, feedback))
    return requests


# -- databases --------------------------------------------------------------------------------
def postgres_base_url() -> str:
    url = os.environ.get("LIVELOOP_TEST_PG_URL")
    if url:
        return url
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(f"scripts/postgres.sh start failed (use --no-postgres to skip):\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


@contextmanager
def fresh_store(backend: str, pg_base: str | None, tmp: Path) -> Iterator[Store]:
    """An empty, migrated store with policy version 0, on its own database; removed afterwards."""
    if backend == "sqlite":
        url, drop = f"sqlite:///{tmp / f'bench_{uuid.uuid4().hex[:12]}.db'}", None
    else:
        import psycopg

        assert pg_base is not None
        name = f"bench_{uuid.uuid4().hex[:12]}"
        admin = pg_base.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = pg_base.rsplit("/", 1)[0] + "/" + name

        def drop() -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    store = Store(StoreConfig(url=url))
    try:
        store.migrate()
        store.ensure_base_version("/x")
        yield store
    finally:
        store.close()
        if drop is not None:
            drop()


def check_written(store: Store, requests: list[Request]) -> tuple[int, int]:
    expected = (len(requests), sum(fb is not None for _, fb in requests))
    counts = store.counts()
    got = (counts["responses"], counts["feedback"])
    if got != expected:
        raise RuntimeError(f"store holds {got} (responses, feedback), expected {expected}")
    return expected


# -- the two ways of writing ------------------------------------------------------------------
def run_baseline(store: Store, requests: list[Request]) -> tuple[float, int]:
    """One transaction per operation, one caller. Returns (seconds, commits)."""
    commits = 0
    start = time.perf_counter()
    for response, feedback in requests:
        for op in (response, feedback):
            if op is None:
                continue
            (result,) = store.write_batch([op])
            if isinstance(result, Exception):
                raise result
            commits += 1
    return time.perf_counter() - start, commits


def run_writer(store: Store, requests: list[Request], threads: int, batch_max: int) -> tuple[float, int]:
    """T handler threads over one BatchWriter; each waits for its commit before its next request."""
    writer = BatchWriter(store, batch_max=batch_max).start()
    errors: list[BaseException] = []

    def handler(share: list[Request]) -> None:
        try:
            for response, feedback in share:
                writer.submit(response).result()
                if feedback is not None:  # the client rates a response only after receiving it
                    writer.submit(feedback).result()
        except BaseException as exc:  # noqa: BLE001 - reported below, on the main thread
            errors.append(exc)

    workers = [threading.Thread(target=handler, args=(requests[t::threads],)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    writer.close()
    if errors:
        raise errors[0]
    return seconds, writer.batches


def measure(backend: str, mode: str, repeat: int, args: argparse.Namespace, pg_base: str | None, tmp: Path) -> Run:
    n = args.responses or DEFAULT_RESPONSES[backend]
    requests = make_workload(n, seed=args.seed + repeat)
    with fresh_store(backend, pg_base, tmp) as store:
        if mode == "baseline":
            seconds, commits = run_baseline(store, requests)
        else:
            seconds, commits = run_writer(store, requests, args.threads, args.batch_max)
        responses, feedback = check_written(store, requests)
    run = Run(backend, mode, repeat, responses, feedback, seconds, commits)
    print(
        f"[store_ingest] {backend:10s} {mode:8s} repeat {repeat}: {run.rows} rows in {seconds:.2f}s "
        f"= {run.rows_per_s:,.0f} rows/s, {commits} commits",
        file=sys.stderr,
        flush=True,
    )
    return run


# -- report -----------------------------------------------------------------------------------
def summarize(runs: list[Run]) -> list[dict]:
    rows = []
    for backend in dict.fromkeys(r.backend for r in runs):
        medians = {}
        for mode in ("baseline", "writer"):
            mine = [r for r in runs if r.backend == backend and r.mode == mode]
            medians[mode] = statistics.median(r.rows_per_s for r in mine)
            rows.append(
                {
                    "backend": backend,
                    "mode": mode,
                    "responses": mine[0].responses,
                    "feedback_rows": [r.feedback for r in mine],
                    "rows_per_s_median": medians[mode],
                    "rows_per_s_runs": [r.rows_per_s for r in mine],
                    "seconds_runs": [r.seconds for r in mine],
                    "rows_per_commit": statistics.median(r.rows / r.commits for r in mine),
                }
            )
        for row in rows[-2:]:
            row["ratio_writer_over_baseline"] = medians["writer"] / medians["baseline"]
    return rows


def markdown(rows: list[dict], threads: int) -> str:
    lines = [
        "| backend | mode | rows/s (responses+feedback) | ratio writer/baseline | rows/commit |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        mode = "baseline (1 txn/op)" if r["mode"] == "baseline" else f"BatchWriter, {threads} threads"
        ratio = f"{r['ratio_writer_over_baseline']:.2f}x" if r["mode"] == "writer" else "1.00x"
        lines.append(
            f"| {r['backend']} | {mode} | {r['rows_per_s_median']:,.0f} | {ratio} | {r['rows_per_commit']:.1f} |"
        )
    return "\n".join(lines)


def environment(pg_base: str | None) -> dict:
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlalchemy": sqlalchemy.__version__,
        "sqlite": sqlite3.sqlite_version,
        "sqlite_synchronous": StoreConfig().sqlite_synchronous,
    }
    if pg_base is not None:
        import psycopg

        with psycopg.connect(pg_base.replace("postgresql+psycopg://", "postgresql://")) as conn:
            env["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
            env["postgresql_fsync"] = conn.execute("SHOW fsync").fetchone()[0]
            env["postgresql_synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--responses",
        type=int,
        default=None,
        help=f"responses per measurement on every backend (default: {DEFAULT_RESPONSES})",
    )
    p.add_argument("--threads", type=int, default=8, help="submitting threads for the BatchWriter (default 8)")
    p.add_argument(
        "--repeats", type=int, default=2, help="runs of each measurement, alternating modes; the median is reported"
    )
    p.add_argument("--no-postgres", action="store_true", help="SQLite only")
    p.add_argument(
        "--batch-max", type=int, default=StoreConfig().batch_max, help="BatchWriter batch_max (default: store config)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS, help=f"JSON result (default {RESULTS.relative_to(ROOT)})")
    args = p.parse_args(argv)
    if args.responses is not None and args.responses < 1:
        p.error("--responses must be >= 1")
    if args.threads < 1 or args.repeats < 1:
        p.error("--threads and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall = time.perf_counter()
    backends = ["sqlite"] if args.no_postgres else ["sqlite", "postgresql"]
    pg_base = None if args.no_postgres else postgres_base_url()

    # 1. every measurement on a fresh database, alternating baseline and writer
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="liveloop-bench-") as tmp:
        for backend in backends:
            for repeat in range(args.repeats):
                for mode in ("baseline", "writer"):
                    runs.append(measure(backend, mode, repeat, args, pg_base, Path(tmp)))

    # 2. medians, the table, the JSON result
    rows = summarize(runs)
    wall = time.perf_counter() - wall
    print(markdown(rows, args.threads))
    print(f"\nwall time {wall:.1f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "store_ingest",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "workload": {
            "prompt_tokens": PROMPT_TOKENS,
            "response_tokens": RESPONSE_TOKENS,
            "vocab": VOCAB,
            "feedback_fraction": FEEDBACK_FRACTION,
            "api_keys": API_KEYS,
            "threads": args.threads,
            "batch_max": args.batch_max,
            "repeats": args.repeats,
            "seed": args.seed,
        },
        "environment": environment(pg_base),
        "results": rows,
        "runs": [asdict(r) | {"rows_per_s": r.rows_per_s} for r in runs],
        "wall_seconds": wall,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
