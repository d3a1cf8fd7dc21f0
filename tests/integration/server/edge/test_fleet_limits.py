"""Fleet-wide limits (server/edge/fleet_limits.py) as an attacker meets them: two replicas' `Admission`
and `LoginThrottle`, each with its own `FleetView` on its own `Store` of one database (SQLite and
PostgreSQL), synced as their loops sync them.

- one key alternating between the replicas is refused at its limit, not at twice it (the same requests
  against per-replica admission get twice it: the attack the fleet view closes), with a Retry-After
  that says when the other replica's slices leave the minute;
- the documented bound: what a replica admits between syncs is the most the fleet passes a limit by;
- a lone replica admits exactly as the in-memory limiter does;
- `max_concurrent_per_key_fleet` caps a key's generations across the replicas, a killed replica's
  level stops counting after `level_fresh`, and a clean stop's last sync pushes what was left and takes
  its levels away;
- failed sign-ins spread over both replicas meet the per-client and the total throttle once."""

from __future__ import annotations

import asyncio
import time

import pytest

from liveloop.server.config import ServerConfig
from liveloop.server.edge.admission import GENERATIONS, Admission, Busy, RateLimited
from liveloop.server.edge.auth import LoginThrottle
from liveloop.server.edge.fleet_limits import FleetRateLimiter, FleetView, level_fresh
from liveloop.store import Store, StoreConfig

LIMIT = 10


@pytest.fixture
def views(store, store_url):
    """Two replicas' views of one database, each through its own store (its own connections)."""
    other = Store(StoreConfig(url=store_url))
    yield FleetView(store.fleet.counts, "r1", 0.05), FleetView(other.fleet.counts, "r2", 0.05)
    other.close()


def sync(*views: FleetView) -> None:
    for v in views:
        v.sync()


def settle(*views: FleetView) -> None:
    """Every view has pushed what it holds and read what every other pushed (a sync reads after its push)."""
    sync(*views, *views)


def admitted_alternating(a: Admission, b: Admission, key: str, tries: int, between=lambda: None) -> tuple[int, RateLimited | None]:
    """Requests of `key` sent to a, b, a, b, ...: how many were admitted before the first refusal."""
    for i in range(tries):
        try:
            (a if i % 2 == 0 else b).check_rate("chat", key)
        except RateLimited as refused:
            return i, refused
        between()
    return tries, None


def test_a_key_alternating_between_replicas_meets_one_limit(views):
    config = ServerConfig(chat_requests_per_minute=LIMIT)
    # per-replica admission (what a fleet had before): each replica lets the key have its whole limit
    alone = admitted_alternating(Admission(config), Admission(config), "k", 4 * LIMIT)
    assert alone[0] == 2 * LIMIT
    r1, r2 = views
    a, b = Admission(config, r1), Admission(config, r2)
    # between two requests each replica has pushed what it admitted and read what the other pushed
    n, refused = admitted_alternating(a, b, "k", 4 * LIMIT, between=lambda: settle(r1, r2))
    assert n == LIMIT and refused is not None
    # the other replica's hits leave the minute with their 10 s slice: wait no more than a minute and a slice
    assert 1 <= refused.retry_after <= 70
    with pytest.raises(RateLimited):  # refused on both replicas, whichever it tries
        a.check_rate("chat", "k")
    with pytest.raises(RateLimited):
        b.check_rate("chat", "k")
    a.check_rate("chat", "other-key")  # another key has its own count
    a.check_rate("feedback", "k")  # and another kind
    assert r2.others("chat", "k") == LIMIT // 2 and r1.others("chat", "k") == LIMIT // 2


def test_the_fleet_passes_a_limit_by_at_most_what_was_not_yet_synced(views):
    r1, r2 = views
    config = ServerConfig(chat_requests_per_minute=LIMIT)
    a, b = Admission(config, r1), Admission(config, r2)
    sync(r1, r2)
    for _ in range(6):
        a.check_rate("chat", "k")  # a burst within one sync interval: r2 has not seen it
    admitted = 0
    with pytest.raises(RateLimited):
        while True:
            b.check_rate("chat", "k")
            admitted += 1
    assert admitted == LIMIT  # r2 alone: its own window is exact; the fleet passed the limit by a's 6 unsynced
    sync(r2, r1)  # r2 pushes, r1 reads
    with pytest.raises(RateLimited):
        a.check_rate("chat", "k")  # once synced, a knows: 6 of its own + 10 of r2's
    assert r1.others("chat", "k") == LIMIT


def test_a_lone_replica_admits_as_the_in_memory_limiter(views):
    r1, _ = views
    config = ServerConfig(chat_requests_per_minute=LIMIT)
    fleet, memory = Admission(config, r1), Admission(config)
    for admission in (fleet, memory):
        for _ in range(LIMIT):
            admission.check_rate("chat", "k")
        r1.sync()
        with pytest.raises(RateLimited) as refused:
            admission.check_rate("chat", "k")
        assert 59 <= refused.value.retry_after <= 60  # the oldest hit leaves the moving minute
    assert r1.others("chat", "k") == 0  # its own pushed counts are never the others'


def test_a_restarted_replica_does_not_reset_a_key(store, views):
    """A replica's counts are its process's (a restart is a new name): they count for the others, and for
    the process that replaces it."""
    r1, _ = views
    config = ServerConfig(chat_requests_per_minute=LIMIT)
    first = Admission(config, r1)
    for _ in range(LIMIT):
        first.check_rate("chat", "k")
    r1.sync()
    again = FleetView(store.fleet.counts, "r1", 0.05)  # the same configured replica id, started again
    again.sync()
    with pytest.raises(RateLimited):
        Admission(config, again).check_rate("chat", "k")


def test_a_fleet_wide_generation_cap(views):
    r1, r2 = views
    config = ServerConfig(max_concurrent_per_key=16, max_concurrent_per_key_fleet=3)
    a, b = Admission(config, r1), Admission(config, r2)
    with a.generation("k", 2):
        settle(r1, r2)
        assert r2.other_levels(GENERATIONS, "k") == 2
        with pytest.raises(Busy, match="across the fleet"):
            b.generation("k", 2).__enter__()  # 2 + 2 > 3 fleet-wide, though r2 runs nothing
        with b.generation("k", 1):
            settle(r1, r2)
            with pytest.raises(Busy, match="across the fleet"):
                a.generation("k", 1).__enter__()  # r1: 2 of its own + r2's 1
            with a.generation("other", 3):  # another key has its own cap
                pass
    settle(r1, r2)
    with b.generation("k", 3):  # both released and synced: the whole cap is r2's
        assert b.total == 3
    # without the fleet cap each replica's own cap is all there is
    free = Admission(ServerConfig(max_concurrent_per_key=16), r2)
    with a.generation("k", 3):
        settle(r1, r2)
        with free.generation("k", 16):
            pass


def test_a_killed_replicas_levels_stop_counting(views):
    r1, r2 = views
    config = ServerConfig(max_concurrent_per_key=16, max_concurrent_per_key_fleet=2)
    a, b = Admission(config, r1), Admission(config, r2)
    stuck = a.generation("k", 2)
    stuck.__enter__()  # r1 dies holding them: it never syncs again
    sync(r1, r2)  # its last push
    with pytest.raises(Busy):
        b.generation("k", 1).__enter__()
    time.sleep(level_fresh(0.05) + 0.2)
    r2.sync()
    with b.generation("k", 2):
        pass


def test_a_clean_stop_pushes_what_is_left_and_takes_its_levels(views):
    r1, r2 = views
    config = ServerConfig(chat_requests_per_minute=LIMIT, max_concurrent_per_key_fleet=4)
    a = Admission(config, r1)

    async def serve_then_stop() -> None:
        loop = asyncio.create_task(r1.run())
        await asyncio.sleep(0.2)  # a few syncs
        slots = a.generation("k", 3)
        slots.__enter__()
        await asyncio.sleep(0.2)
        assert r2.sync() is None and r2.other_levels(GENERATIONS, "k") == 3
        for _ in range(4):
            a.check_rate("chat", "k")  # not yet pushed when the server stops
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop

    asyncio.run(serve_then_stop())
    r2.sync()
    assert r2.others("chat", "k") == 4 and r2.other_levels(GENERATIONS, "k") == 0


def test_failed_sign_ins_spread_over_replicas_meet_one_throttle(views):
    r1, r2 = views
    a, b = LoginThrottle(3, 5, FleetRateLimiter(r1)), LoginThrottle(3, 5, FleetRateLimiter(r2))
    for i in range(3):  # one client, alternating replicas
        throttle = a if i % 2 == 0 else b
        assert throttle.retry_after("10.0.0.1") is None
        throttle.failed("10.0.0.1")
        settle(r1, r2)
    for throttle in (a, b):  # refused on both: 3 failures of this client, fleet-wide
        wait = throttle.retry_after("10.0.0.1")
        assert wait is not None and 1 <= wait <= 71
    assert a.retry_after("10.0.0.2") is None
    a.failed("10.0.0.2")
    b.failed("10.0.0.3")
    settle(r1, r2)
    for throttle in (a, b):  # the total: 5 failures a minute, all clients and replicas together
        assert throttle.retry_after("10.0.0.9") is not None
    # the same guesses against per-replica throttles: each replica allows its own 3 and 5
    lone = [LoginThrottle(3, 5), LoginThrottle(3, 5)]
    for i in range(4):
        lone[i % 2].failed("10.0.0.1")
    assert all(t.retry_after("10.0.0.1") is None for t in lone)
