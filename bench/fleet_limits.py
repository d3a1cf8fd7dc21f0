"""Fleet-wide limits on the request path: what admitting a request costs with the fleet limiter
(server/edge/fleet_limits.py) against the in-memory one it replaces, side by side in one process.

Each request does what a chat does at the edge: `Admission.check_rate("chat", key)` and one
generation slot (`with admission.generation(key)`), over `--keys` keys in turn (limits high enough
that nothing is refused). Three arms, their rounds interleaved in a rotating order so that each ratio
compares rounds that saw the same load on the machine (the ratio reported: the median of the
per-round ratios), on the request thread's CPU time (immune to other processes on a shared machine) and
on wall time (which also pays the sync threads' share of the interpreter lock):
- memory: `Admission(config)`, the `limits` library's moving window in memory (one replica alone);
- fleet: `Admission(config, view)` with `max_concurrent_per_key_fleet` on, its `FleetView` syncing
  through a real store every `--sync` seconds in a thread (as a replica's loop does), no other replica;
- fleet+peer: the same, with a second replica's view counting the same keys and syncing too, so that
  every key has the others' count to add to its own.
Each arm has its own keys; every view reads the whole table at each sync (the others' rows of every
arm), as a replica of a busy fleet does. Also timed: one sync of the fleet+peer view with an increment of
each of its `--keys` keys to push and the peer's counts to read.

    .venv/bin/python bench/fleet_limits.py [--store sqlite|URL] [--keys 256] [--requests 20000] [--rounds 15]
    PGPASSFILE=$(bash scripts/postgres.sh passfile) .venv/bin/python bench/fleet_limits.py \
        --store postgresql+psycopg://postgres@127.0.0.1:55432/liveloop_test
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from pathlib import Path

from common import median, save  # noqa: E402


def _admin(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _fresh_database(url: str) -> str:
    """A new database beside the one `url` names (PostgreSQL), for this run alone."""
    import psycopg

    name = f"fleet_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def _drop_database(url: str, fresh: str) -> None:
    import psycopg

    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {fresh.rsplit('/', 1)[1]} WITH (FORCE)")


def _syncing(view, seconds: float, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(seconds):
            view.sync()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _counting(admission, keys: list[str], stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        i = 0
        while not stop.wait(0.005):
            admission.check_rate("chat", keys[i % len(keys)])
            i += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _round(admission, keys: list[str], n: int) -> tuple[float, float]:
    """Seconds per request over `n` requests: wall, and this thread's CPU (what the request path costs,
    whatever else the machine runs)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for i in range(n):
        key = keys[i % len(keys)]
        admission.check_rate("chat", key)
        with admission.generation(key):
            pass
    return (time.perf_counter() - wall) / n, (time.thread_time() - cpu) / n


def _ratio(per_round: dict[str, list[tuple[float, float]]], arm: str, which: int) -> float:
    """The median over rounds of `arm`'s time per request over memory's in the same round."""
    return round(median([a[which] / m[which] for a, m in zip(per_round[arm], per_round["memory"])]), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite",
                        help="sqlite (a fresh file) or a PostgreSQL URL (a fresh database is made beside the one it names, dropped after)")
    parser.add_argument("--keys", type=int, default=256)
    parser.add_argument("--requests", type=int, default=20000, help="requests per round and arm")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sync", type=float, default=0.25, help="[server] limits_sync_seconds")
    args = parser.parse_args()

    from liveloop.server.config import ServerConfig
    from liveloop.server.edge.admission import Admission
    from liveloop.server.edge.fleet_limits import FleetView
    from liveloop.store import Store, StoreConfig
    from liveloop.store.fleet_counts import FleetCounts

    tmp = tempfile.TemporaryDirectory()
    url = f"sqlite:///{Path(tmp.name) / 'fleet.db'}" if args.store == "sqlite" else _fresh_database(args.store)
    stores = [Store(StoreConfig(url=url)) for _ in range(3)]
    stores[0].migrate()
    config = ServerConfig(chat_requests_per_minute=10**6,  # per key and minute: no round reaches it
                          max_concurrent_per_key=16, max_concurrent_per_key_fleet=16, limits_sync_seconds=args.sync)
    views = {name: FleetView(store.fleet.counts, name, args.sync) for name, store in zip(("lone", "shared", "peer"), stores)}
    keys = {arm: [f"{arm}-{i:05d}" for i in range(args.keys)] for arm in ("memory", "fleet", "fleet+peer")}
    peer = Admission(config, views["peer"])
    for key in keys["fleet+peer"]:  # the peer replica has counted every key of that arm: its view adds the count
        peer.check_rate("chat", key)
    views["peer"].sync()
    views["shared"].sync()
    assert all(views["shared"].others("chat", k) == 1 for k in keys["fleet+peer"])
    assert not any(views["lone"].others("chat", k) for k in keys["fleet"])
    arms = {"memory": Admission(config), "fleet": Admission(config, views["lone"]), "fleet+peer": Admission(config, views["shared"])}
    stop = threading.Event()
    threads = [_syncing(v, args.sync, stop) for v in views.values()]
    threads.append(_counting(peer, keys["fleet+peer"], stop))  # the peer keeps counting them, a few hundred a second
    for name, admission in arms.items():  # warm up (imports, first allocations)
        _round(admission, keys[name], 1000)
    per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            per_round[name].append(_round(arms[name], keys[name], args.requests))
    stop.set()
    for t in threads:
        t.join(5)
    sync_ms = []
    for _ in range(20):  # one sync with every key's increment to push and the peer's counts to read
        for key in keys["fleet+peer"]:
            arms["fleet+peer"].check_rate("chat", key)
        start = time.perf_counter()
        views["shared"].sync()
        sync_ms.append((time.perf_counter() - start) * 1000)
    for store in stores:
        store.close()
    if args.store != "sqlite":
        _drop_database(args.store, url)

    result = {
        "store": stores[0].dialect,
        "keys": args.keys,
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "sync_seconds": args.sync,
        "us_per_request_cpu": {name: round(median([c for _, c in v]) * 1e6, 3) for name, v in per_round.items()},
        "us_per_request_wall": {name: round(median([w for w, _ in v]) * 1e6, 3) for name, v in per_round.items()},
        "ratio_fleet_to_memory_cpu": _ratio(per_round, "fleet", 1),
        "ratio_fleet_peer_to_memory_cpu": _ratio(per_round, "fleet+peer", 1),
        "ratio_fleet_to_memory_wall": _ratio(per_round, "fleet", 0),
        "ratio_fleet_peer_to_memory_wall": _ratio(per_round, "fleet+peer", 0),
        "sync_ms_median": round(median(sync_ms), 3),
    }
    print(result)
    path = save(f"fleet_limits_{result['store']}", result)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
