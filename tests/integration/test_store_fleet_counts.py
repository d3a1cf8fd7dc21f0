"""The fleet's shared counts (store/fleet_counts.py, migration 0014) on real SQLite and PostgreSQL, two
stores on one database as two replicas' processes have them: a replica's increments add up in its own
rows and every other replica reads them (never its own); levels replace the replica's last ones, and a
level not rewritten within the reader's freshness counts no more; a replica that stops takes its levels
away but its window counts stay; windows past the keep are pruned; a read-only sync writes nothing."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from liveloop.store import Store, StoreConfig
from liveloop.store.fleet_counts import KEEP_SECONDS, LEVEL, FleetCount


@pytest.fixture
def pair(store, store_url):
    other = Store(StoreConfig(url=store_url))
    yield store.fleet.counts, other.fleet.counts, store
    other.close()


def _window(db_now: float) -> int:
    return int(db_now // 10 * 10)


def test_each_replica_reads_the_others_counts_not_its_own(pair):
    a, b, store = pair
    now = a.sync("a", {}, None, 70, 5).db_now
    w = _window(now)
    a.sync("a", {("chat", "k1", w): 3, ("login", "*", w): 1}, None, 70, 5)
    seen_by_a = a.sync("a", {("chat", "k1", w): 2}, None, 70, 5)  # the upsert adds to its own row
    assert seen_by_a.windows == {}  # nobody else counted
    seen_by_b = b.sync("b", {("chat", "k1", w): 4, ("chat", "k2", w - 10): 1}, None, 70, 5)
    assert seen_by_b.windows == {("chat", "k1"): {w: 5}, ("login", "*"): {w: 1}}
    seen_by_a = a.sync("a", {}, None, 70, 5)
    assert seen_by_a.windows == {("chat", "k1"): {w: 4}, ("chat", "k2"): {w - 10: 1}}
    third = store.fleet.counts.sync("c", {}, None, 70, 5)  # a third replica sees both, summed per window
    assert third.windows[("chat", "k1")] == {w: 9} and abs(third.db_now - time.time()) < 5


def test_levels_replace_expire_and_leave_with_their_replica(pair):
    a, b, _ = pair
    a.sync("a", {}, {("generations", "k1"): 3, ("generations", "k2"): 1}, 70, 5)
    assert b.sync("b", {}, None, 70, 5).levels == {("generations", "k1"): 3, ("generations", "k2"): 1}
    a.sync("a", {}, {("generations", "k1"): 2, ("generations", "k2"): 0}, 70, 5)  # replaced; zeros are not stored
    b.sync("b", {}, {("generations", "k1"): 5}, 70, 5)
    assert b.sync("b", {}, None, 70, 5).levels == {("generations", "k1"): 2}
    assert a.sync("a", {}, None, 70, 5).levels == {("generations", "k1"): 5}
    time.sleep(1.2)
    assert b.sync("b", {}, None, 70, 1.0).levels == {}  # a's level was written over a second ago: a dead replica's
    assert b.sync("b", {}, None, 70, 5).levels == {("generations", "k1"): 2}
    a.remove("a")
    assert b.sync("b", {}, None, 70, 5).levels == {}


def test_old_windows_are_pruned_and_a_read_writes_nothing(pair):
    a, b, store = pair
    now = a.sync("a", {}, None, 70, 5).db_now
    w = _window(now)
    old = int(now - KEEP_SECONDS - 60)
    a.sync("a", {("chat", "k1", old): 7, ("chat", "k1", w): 1}, None, 10 * KEEP_SECONDS, 5)
    assert b.sync("b", {}, None, 10 * KEEP_SECONDS, 5).windows == {("chat", "k1"): {old: 7, w: 1}}
    assert b.sync("b", {}, None, 70, 5).windows == {("chat", "k1"): {w: 1}}  # beyond the horizon: not read
    b.sync("b", {}, None, 70, 5, prune=True)
    assert b.sync("b", {}, None, 10 * KEEP_SECONDS, 5).windows == {("chat", "k1"): {w: 1}}
    with store.db.session() as s:
        rows = s.scalar(select(func.count()).select_from(FleetCount))
        levels = s.scalar(select(func.count()).select_from(FleetCount).where(FleetCount.window_start == LEVEL))
    assert (rows, levels) == (1, 0)  # b's reads wrote no row of its own
