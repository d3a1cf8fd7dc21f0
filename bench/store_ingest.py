"""Store ingest throughput: served responses plus feedback rows written per second, through liveloop's
real store code, on SQLite and PostgreSQL, against raw batched inserts of the same rows.

Ways of writing the same workload, each into a fresh database:
  baseline  one transaction per operation: `store.feedback.write_batch([op])` in a loop, one caller;
  writer    liveloop's group-commit `BatchWriter`, fed by C concurrent requests on one asyncio loop,
            each awaiting its commit (`writer.write`) the way the server's handlers do;
  writers2  (PostgreSQL) two server replicas: two processes, each with its own Store and BatchWriter
            fed by C concurrent requests, each writing half the workload into the one database at
            once; rows/s over the wall time from a common start until both are done. Their ratings'
            ids come from the feedback-id counter (migration 0008), whose row lock each transaction
            holds from taking its ids to its commit, so that ids are commit order;
  writers2_seq  the same two processes with rating ids drawn from a plain sequence, as before 0008
            (unsafe: a learner's cursor can skip a rating committed behind a larger id): what the
            counter's lock costs, side by side;
  raw       the database's pace: the same rows, already encoded, inserted by the bare driver in
            transactions of `batch_max` operations (SQLite: sqlite3 executemany; PostgreSQL: psycopg
            COPY for responses, executemany for ratings with ids taken from the counter in one UPDATE
            as the writer takes them), same schema, same pragmas, no liveloop code.
The workload is N responses (64 prompt tokens, 128 response tokens, random ids < 1024, float32
logprobs), about half of them followed by a rating from the same API key once the response is
committed. Each measurement is repeated, alternating the modes (in reverse order every other
repeat), and the median reported.

A closed loop of C clients can put at most C rows in one commit (each waits for its commit before its
next write), so the writer reaches the database's pace only when enough requests are in flight: C is
2 x batch_max by default, so that a full batch is queued while the previous one commits (8 clients,
as this benchmark used to run, cap a commit at 8 rows and measure the clients, not the writer). The
table prints rows/commit so that limit shows. The baseline writes a smaller sample (it commits
every row).

    .venv/bin/python bench/store_ingest.py                     # SQLite and PostgreSQL, default sizes
    .venv/bin/python bench/store_ingest.py --no-postgres --responses 1000 --repeats 2
    .venv/bin/python bench/store_ingest.py --no-sqlite --modes writer,writers2,writers2_seq  # one vs two replicas

PostgreSQL comes from --pg-url, else LIVELOOP_TEST_PG_URL, else scripts/postgres.sh; each run gets its
own database, dropped afterwards. Prints a Markdown table and writes bench/results/store_ingest.json.
Needs no torch and no model: the store knows nothing of either.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import sqlalchemy

from psycopg.types.json import Json
from sqlalchemy.dialects import sqlite as sqlite_dialect

from liveloop.store import BatchWriter, FeedbackRecord, ResponseRecord, Store, StoreConfig
from liveloop.store.models import Feedback, Response
from liveloop.store.feedback import _feedback_row, response_row

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "store_ingest.json"

DEFAULT_RESPONSES = {"sqlite": 20000, "postgresql": 10000}
BASELINE_RESPONSES = 1000  # one commit per row: a sample is enough to know its pace
PROMPT_TOKENS = 64
RESPONSE_TOKENS = 128
VOCAB = 1024
FEEDBACK_FRACTION = 0.5
API_KEYS = 16

MODES = ("baseline", "writer", "writers2", "writers2_seq", "raw")
TWO_WRITER_MODES = ("writers2", "writers2_seq")  # PostgreSQL only: SQLite has one writer at a time

# One request's worth of work: a response and, for about half of them, the rating that follows it.
Request = tuple[ResponseRecord, FeedbackRecord | None]


@dataclass
class Run:
    backend: str
    mode: str  # one of MODES
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
def postgres_base_url(given: str | None = None) -> str:
    url = given or os.environ.get("LIVELOOP_TEST_PG_URL")
    if url:
        return url
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SystemExit(f"scripts/postgres.sh start failed (use --no-postgres to skip):\n{proc.stderr}")
    if "PGPASSFILE" not in os.environ:  # the cluster asks for its password: libpq reads it from this file
        passfile = subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "passfile"], capture_output=True, text=True, check=True)
        os.environ["PGPASSFILE"] = passfile.stdout.strip()
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
        store.versions.ensure_base_version("/x")
        yield store
    finally:
        store.close()
        if drop is not None:
            drop()


def check_written(store: Store, requests: list[Request]) -> tuple[int, int]:
    expected = (len(requests), sum(fb is not None for _, fb in requests))
    counts = store.feedback.counts()
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
            (result,) = store.feedback.write_batch([op])
            if isinstance(result, Exception):
                raise result
            commits += 1
    return time.perf_counter() - start, commits


def run_writer(store: Store, requests: list[Request], concurrency: int, batch_max: int) -> tuple[float, int]:
    """C concurrent requests over one BatchWriter, on one asyncio loop like the server's handlers:
    each awaits its response's commit, then its rating's."""
    writer = BatchWriter(store, batch_max=batch_max).start()

    async def client(share: list[Request]) -> None:
        for response, feedback in share:
            await writer.write(response)
            if feedback is not None:  # the client rates a response only after receiving it
                result = await writer.write(feedback)
                if isinstance(result, Exception):
                    raise result

    async def everyone() -> None:
        await asyncio.gather(*(client(requests[c::concurrency]) for c in range(concurrency)))

    start = time.perf_counter()
    asyncio.run(everyone())
    seconds = time.perf_counter() - start
    writer.close()
    return seconds, writer.batches


# -- two replicas: two processes, a writer each, one database ------------------------------------
OLD_IDS = "bench_sequence_ids"  # writers2_seq: the sequence its ratings' ids are drawn from


def _sequence_ids(conn: sqlalchemy.Connection, rows: list[dict]) -> list[int]:
    """store/feedback.py `_insert_ratings` as before migration 0008 (PostgreSQL): ids drawn from a sequence, not
    in commit order. Only to measure what the counter's lock costs."""
    from liveloop.store.bulk import insert_rows
    from liveloop.store.feedback import FEEDBACK_TABLE

    ids = sorted(conn.execute(sqlalchemy.text(f"SELECT nextval('{OLD_IDS}') FROM generate_series(1, :n)"), {"n": len(rows)}).scalars())
    insert_rows(conn, FEEDBACK_TABLE, [row | {"id": fid} for row, fid in zip(rows, ids)])
    return ids


def _replica(url: str, n: int, seed: int, concurrency: int, batch_max: int, sequence_ids: bool, ready, start, out) -> None:
    """One replica's process: its own Store and BatchWriter, its share of the workload built before
    the common start; reports (seconds, commits) or the error."""
    try:
        if sequence_ids:
            import liveloop.store.feedback as store_module

            store_module._insert_ratings = _sequence_ids
        requests = make_workload(n, seed)
        store = Store(StoreConfig(url=url))
        store.ping()
        ready.set()
        start.wait()
        out.put(run_writer(store, requests, concurrency, batch_max))
        store.close()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        ready.set()
        out.put(exc)


def run_two_writers(store: Store, n: int, seed: int, concurrency: int, batch_max: int, sequence_ids: bool) -> tuple[float, int, list[Request]]:
    """Two replica processes write n/2 requests each into `store`'s database at once. Returns (wall
    seconds from the common start until both finished, commits, the requests both wrote)."""
    url = store.engine.url.render_as_string(hide_password=False)
    if sequence_ids:
        with store.engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE SEQUENCE {OLD_IDS}"))
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    halves = [(n + 1) // 2, n // 2]
    seeds = [seed, seed + 10_000]
    readies, procs = [], []
    for half, sd in zip(halves, seeds):
        ready = ctx.Event()
        procs.append(ctx.Process(target=_replica, args=(url, half, sd, concurrency, batch_max, sequence_ids, ready, start, out)))
        readies.append(ready)
    for proc in procs:
        proc.start()
    for ready in readies:
        if not ready.wait(120):
            raise RuntimeError("a replica process did not start within 120 s")
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    seconds = time.perf_counter() - began
    for proc in procs:
        proc.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise RuntimeError(f"a replica failed: {result!r}") from result
    requests = [req for half, sd in zip(halves, seeds) for req in make_workload(half, sd)]
    return seconds, sum(commits for _, commits in results), requests


# -- raw batched inserts: the same rows, no liveloop code on the timed path -------------------------
RESPONSE_COLUMNS = [c.name for c in Response.__table__.columns]  # every column the writer fills
FEEDBACK_COLUMNS = ["response_id", "api_key_id", "reward", "comment", "created_at", "revisions"]


def raw_batches(requests: list[Request], batch_max: int, backend: str) -> list[tuple[list[tuple], list[tuple]]]:
    """The workload's operations in arrival order, `batch_max` to a transaction, each batch as
    (response rows, rating rows) of database-native values (encoded before any timing starts)."""
    now = datetime.now(timezone.utc)
    ops: list[tuple[str, tuple]] = []
    for response, feedback in requests:
        row = response_row(response, now)
        ops.append(("r", tuple(_native(backend, Response.__table__.c[c].type, row[c]) for c in RESPONSE_COLUMNS)))
        if feedback is not None:
            fb = _feedback_row(feedback, now) | {"revisions": 0}
            ops.append(("f", tuple(_native(backend, Feedback.__table__.c[c].type, fb[c]) for c in FEEDBACK_COLUMNS)))
    batches = []
    for i in range(0, len(ops), batch_max):
        chunk = ops[i : i + batch_max]
        batches.append(([r for kind, r in chunk if kind == "r"], [r for kind, r in chunk if kind == "f"]))
    return batches


def _native(backend: str, column_type, value):
    """A value as the driver takes it: what SQLAlchemy's bind processing would hand it."""
    if backend == "postgresql":
        if isinstance(column_type, sqlalchemy.JSON):
            return None if value is None and column_type.none_as_null else Json(value)
        return value
    dialect = sqlite_dialect.dialect()
    process = column_type.dialect_impl(dialect).bind_processor(dialect)
    return process(value) if process else value


def _insert_sql(table: str, columns: list[str], style: str) -> str:
    marks = ", ".join("?" if style == "qmark" else "%s" for _ in columns)
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"


def run_raw(store: Store, requests: list[Request], batch_max: int) -> tuple[float, int]:
    """The bare driver: one transaction per batch of `batch_max` operations. Returns (seconds, commits)."""
    backend = store.dialect
    batches = raw_batches(requests, batch_max, backend)
    if backend == "sqlite":
        seconds = _raw_sqlite(store, batches)
    else:
        seconds = _raw_postgres(store, batches)
    return seconds, len(batches)


def _raw_sqlite(store: Store, batches: list[tuple[list[tuple], list[tuple]]]) -> float:
    conn = sqlite3.connect(store.engine.url.database, timeout=30, isolation_level=None)
    for pragma in ("journal_mode=WAL", f"synchronous={store.config.sqlite_synchronous}", "foreign_keys=ON"):
        conn.execute(f"PRAGMA {pragma}")
    insert_response = _insert_sql("responses", RESPONSE_COLUMNS, "qmark")
    insert_feedback = _insert_sql("feedback", FEEDBACK_COLUMNS, "qmark")
    start = time.perf_counter()
    for responses, ratings in batches:
        conn.execute("BEGIN")
        conn.executemany(insert_response, responses)
        if ratings:
            conn.executemany(insert_feedback, ratings)
        conn.execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds


def _raw_postgres(store: Store, batches: list[tuple[list[tuple], list[tuple]]]) -> float:
    """Ratings' ids are taken from the feedback-id counter in one UPDATE per batch, as the writer takes
    them (the column's default would take them one row at a time)."""
    import psycopg

    url = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    copy_responses = f"COPY responses ({', '.join(RESPONSE_COLUMNS)}) FROM STDIN"
    insert_feedback = _insert_sql("feedback", ["id", *FEEDBACK_COLUMNS], "format")
    take_ids = "UPDATE feedback_counter SET last_id = last_id + %s WHERE id = 1 RETURNING last_id"
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        for responses, ratings in batches:
            with conn.cursor() as cur:
                with cur.copy(copy_responses) as copy:
                    for row in responses:
                        copy.write_row(row)
                if ratings:
                    last = cur.execute(take_ids, (len(ratings),)).fetchone()[0]
                    first = last - len(ratings) + 1
                    cur.executemany(insert_feedback, [(first + k, *row) for k, row in enumerate(ratings)])
            conn.commit()
        return time.perf_counter() - start


def measure(backend: str, mode: str, repeat: int, args: argparse.Namespace, pg_base: str | None, tmp: Path) -> Run:
    n = args.responses or DEFAULT_RESPONSES[backend]
    if mode == "baseline":
        n = min(n, args.baseline_responses)
    requests = make_workload(n, seed=args.seed + repeat)
    with fresh_store(backend, pg_base, tmp) as store:
        if mode == "baseline":
            seconds, commits = run_baseline(store, requests)
        elif mode == "writer":
            seconds, commits = run_writer(store, requests, args.concurrency, args.batch_max)
        elif mode in TWO_WRITER_MODES:
            seconds, commits, requests = run_two_writers(
                store, n, args.seed + repeat, args.concurrency, args.batch_max, sequence_ids=mode == "writers2_seq"
            )
        else:
            seconds, commits = run_raw(store, requests, args.batch_max)
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
        modes = [m for m in MODES if any(r.backend == backend and r.mode == m for r in runs)]
        for mode in modes:
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
        for row in rows[-len(modes) :]:
            for other in ("baseline", "writer", "raw"):
                row[f"ratio_over_{other}"] = medians[row["mode"]] / medians[other] if other in medians else None
    return rows


def _ratio(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def markdown(rows: list[dict], concurrency: int, batch_max: int) -> str:
    names = {
        "baseline": "baseline (1 txn/op)",
        "writer": f"BatchWriter, {concurrency} concurrent requests",
        "writers2": f"2 processes x BatchWriter, {concurrency} requests each (counter ids)",
        "writers2_seq": f"2 processes x BatchWriter, {concurrency} requests each (sequence ids, pre-0008)",
        "raw": f"raw driver, {batch_max} ops/txn",
    }
    lines = [
        "| backend | mode | rows/s (responses+feedback) | / baseline | / one writer | / raw | rows/commit |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {names[r['mode']]} | {r['rows_per_s_median']:,.0f} | {_ratio(r['ratio_over_baseline'], 'x')} "
            f"| {_ratio(r['ratio_over_writer'])} | {_ratio(r['ratio_over_raw'])} | {r['rows_per_commit']:.1f} |"
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
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="requests in flight on the BatchWriter (default 2 x batch_max: a full batch waits while one commits)",
    )
    p.add_argument(
        "--baseline-responses",
        type=int,
        default=BASELINE_RESPONSES,
        help=f"responses for the one-commit-per-row baseline (default {BASELINE_RESPONSES})",
    )
    p.add_argument(
        "--repeats", type=int, default=2, help="runs of each measurement, alternating modes; the median is reported"
    )
    p.add_argument("--no-postgres", action="store_true", help="SQLite only")
    p.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    p.add_argument("--pg-url", default=None, help="PostgreSQL server (default: LIVELOOP_TEST_PG_URL, else scripts/postgres.sh)")
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (the two-writer modes run on PostgreSQL only)",
    )
    p.add_argument(
        "--batch-max", type=int, default=StoreConfig().batch_max, help="BatchWriter batch_max (default: store config)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS, help=f"JSON result (default {RESULTS.relative_to(ROOT)})")
    args = p.parse_args(argv)
    if args.responses is not None and args.responses < 1:
        p.error("--responses must be >= 1")
    args.concurrency = args.concurrency or 2 * args.batch_max
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not args.modes or set(args.modes) - set(MODES):
        p.error(f"--modes: choose from {', '.join(MODES)}")
    if args.no_postgres and args.no_sqlite:
        p.error("--no-postgres and --no-sqlite leave nothing to measure")
    if args.concurrency < 1 or args.repeats < 1:
        p.error("--concurrency and --repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import save

    args = parse_args(argv)
    wall = time.perf_counter()
    backends = [b for b, off in (("sqlite", args.no_sqlite), ("postgresql", args.no_postgres)) if not off]
    pg_base = None if args.no_postgres else postgres_base_url(args.pg_url)

    # 1. every measurement on a fresh database, alternating baseline and writer
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="liveloop-bench-") as tmp:
        for backend in backends:
            for repeat in range(args.repeats):
                # the order reverses every other repeat, so neither neighbour of a mode is always the same
                for mode in args.modes if repeat % 2 == 0 else reversed(args.modes):
                    if mode in TWO_WRITER_MODES and backend != "postgresql":
                        continue
                    runs.append(measure(backend, mode, repeat, args, pg_base, Path(tmp)))

    # 2. medians, the table, the JSON result
    rows = summarize(runs)
    wall = time.perf_counter() - wall
    print(markdown(rows, args.concurrency, args.batch_max))
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
            "concurrency": args.concurrency,
            "baseline_responses": args.baseline_responses,
            "batch_max": args.batch_max,
            "repeats": args.repeats,
            "modes": list(args.modes),
            "seed": args.seed,
        },
        "environment": environment(pg_base),
        "results": rows,
        "runs": [asdict(r) | {"rows_per_s": r.rows_per_s} for r in runs],
        "wall_seconds": wall,
    }
    print(f"wrote {save('store_ingest', result, path=args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
