"""Fleet-wide limits: what this replica knows of every replica's counts (`FleetView`), and the rate
limiter that adds them to its own (`FleetRateLimiter`), so that a key's per-minute rates, its
fleet-wide generation cap and the dashboard's sign-in throttle hold for a whole fleet (several
`liveloop serve` processes, or Ray Serve replicas, on one store), not N times over.

No database round trip on a request's path. Each replica counts what it admits in memory: its own
moving window (the `limits` library, exactly as a lone server counts) and, per (bucket, subject),
its increments per `period / SLICES` seconds (10 s for the per-minute limits). `FleetView.run` syncs
every `[server] limits_sync_seconds`, off the event loop: one transaction adds the increments to
the replica's own rows and reads what the OTHER replicas' rows add up to (store/fleet_counts.py). A
request is admitted when its replica's exact count, plus the others' count as last read, plus its
cost, is within the limit; with one replica the others' count is 0 and admission is what it was.

A replica sees another's admissions up to about `2 * limits_sync_seconds` late, so the fleet may admit
somewhat more than a limit, never more than N times it (the bounds: `FleetView`, docs/api.md).

Not the `limits` library's own distributed storages: they are Redis, Memcached, MongoDB or etcd
(another service to run; liveloop's only shared service is its SQL store), and each hit is a network
round trip on the request's path. The local exact window stays the library's."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from limits import RateLimitItem, WindowStats, storage, strategies

from liveloop.store.fleet_counts import FleetCounts

if TYPE_CHECKING:
    from liveloop.server.config import ServerConfig

log = logging.getLogger(__name__)

PERIOD = 60.0  # every fleet-wide limit counts per minute (the `[server] ..._per_minute` knobs)
SLICES = 6  # a period's slices: the others' counts are known per PERIOD / SLICES seconds
PRUNE_SECONDS = 60.0  # a replica deletes windows past the store's keep at most this often


def level_fresh(sync_seconds: float) -> float:
    """How long a replica's pushed level counts without a newer push (it rewrites it while not zero at
    a third of this): a replica killed with generations running stops counting after it."""
    return max(3.0, 10 * sync_seconds)


class FleetView:
    """This replica's view of the fleet's counts: its own increments not yet pushed, the other replicas'
    counts and levels as last read, and the database's clock (offset from this host's). Thread-safe:
    requests count on the event loop (or in worker threads), `sync` runs in a thread.

    Bounds (documented in docs/api.md): a replica does not see what another admitted since that one's
    last push before its own last read, at most about `2 * limits_sync_seconds` plus one sync's
    duration. So in any `period` the fleet admits at most the limit plus what the OTHER replicas admit
    in that lag (N replicas taking a key's requests at r each per second: about
    `(N - 1) * r * 2 * limits_sync_seconds` beyond it), and never more than N times the limit (each
    replica's own window is exact). The same bound holds for levels (generations running per key,
    `max_concurrent_per_key_fleet`): a level is what each replica holds as of its last push; a replica
    that stops pushing (killed) counts for `level_fresh` seconds more."""

    def __init__(self, counts: FleetCounts, replica: str, sync_seconds: float, period: float = PERIOD,
                 clock: Callable[[], float] = time.time):
        self.counts = counts
        self.name = f"{replica}/{uuid.uuid4().hex[:8]}"  # unique per start: a restarted replica's counts stay the fleet's
        self.sync_seconds = sync_seconds
        self.period = period
        self.slice = period / SLICES
        self.level_fresh = level_fresh(sync_seconds)
        self._clock = clock
        self._offset = 0.0  # the database's clock minus this host's, as of the last sync
        self._lock = threading.Lock()  # the increments and levels, between request threads and the sync
        self._sync_lock = threading.Lock()  # one sync at a time (the loop's and a final one at shutdown)
        self._added: dict[tuple[str, str, int], int] = {}
        self._levels: dict[tuple[str, str], int] = {}
        self._levels_changed = False
        self._levels_pushed_at = -math.inf
        # the others' slices: (bucket, subject) -> (their count, when the first leaves the period, ((leaves at, count), ...)
        # in the order they leave); a slice starting at s leaves it at s + slice + period
        self._others: dict[tuple[str, str], tuple[int, float, tuple[tuple[float, int], ...]]] = {}
        self._other_levels: dict[tuple[str, str], int] = {}
        self._pruned_at = -math.inf
        self.synced_at: float | None = None  # time.monotonic() of the last sync that succeeded
        self._failing = False

    # -- what requests use (in memory) ---------------------------------------------------------------
    def now(self) -> float:
        """The database's clock, as this host estimates it."""
        return self._clock() + self._offset

    def others(self, bucket: str, subject: str) -> int:
        """The other replicas' count of (bucket, subject) in the last period: their slices that overlap it.
        A slice counts whole until it has entirely left the window, so the estimate is never below the
        others' true count at the last sync (a key that reached its limit may wait up to one slice, 10 s,
        longer than an exact window would make it; Retry-After says when the slices leave)."""
        known = self._others.get((bucket, subject))
        if known is None:
            return 0
        total, first_leaves, slices = known
        now = self.now()
        if now < first_leaves:  # no slice has left the period since the sync
            return total
        return sum(n for leaves, n in slices if leaves > now)

    def others_fall_to(self, bucket: str, subject: str, room: int) -> float:
        """Seconds until the others' count of (bucket, subject) is at most `room` >= 0 (0: it is now), as
        their known slices leave the period."""
        now = self.now()
        slices = [(leaves, n) for leaves, n in self._others.get((bucket, subject), (0, 0.0, ()))[2] if leaves > now]
        left = sum(n for _, n in slices)
        for leaves, n in slices:
            if left <= room:
                break
            left -= n
            if left <= room:
                return leaves - now
        return 0.0

    def add(self, bucket: str, subject: str, n: int = 1) -> None:
        """Count `n` admitted (bucket, subject) in the slice of now (pushed at the next sync)."""
        start = int(self.now() // self.slice * self.slice)
        key = (bucket, subject, start)
        with self._lock:
            self._added[key] = self._added.get(key, 0) + n

    def set_level(self, bucket: str, subject: str, n: int) -> None:
        """What this replica holds now of (bucket, subject) (generations running for a key)."""
        with self._lock:
            if n > 0:
                self._levels[(bucket, subject)] = n
            else:
                self._levels.pop((bucket, subject), None)
            self._levels_changed = True

    def other_levels(self, bucket: str, subject: str) -> int:
        """What the other replicas held of (bucket, subject) at their last pushes (fresh ones only)."""
        return self._other_levels.get((bucket, subject), 0)

    # -- the sync (in a thread) ----------------------------------------------------------------------
    def sync(self) -> None:
        """Push this replica's increments (and its levels, when they changed or are due again), read the
        others' counts. Increments that could not be pushed are kept for the next sync. While the store
        does not answer, the others' counts stay as last read and leave the window as their slices pass
        (the limits fall back to each replica's own); `run` logs the failure once until a sync succeeds."""
        with self._sync_lock:
            mono = time.monotonic()
            with self._lock:
                added, self._added = self._added, {}
                push_levels = self._levels_changed or (self._levels and mono - self._levels_pushed_at >= self.level_fresh / 3)
                levels = dict(self._levels) if push_levels else None
                self._levels_changed = False
            prune = mono - self._pruned_at >= PRUNE_SECONDS
            before = self._clock()
            try:
                snapshot = self.counts.sync(self.name, added, levels, self.period + 2 * self.slice, self.level_fresh, prune)
            except Exception:
                with self._lock:
                    for key, n in added.items():
                        self._added[key] = self._added.get(key, 0) + n
                    self._levels_changed = self._levels_changed or levels is not None
                raise
            after = self._clock()
            self._offset = snapshot.db_now - (before + after) / 2
            known = (self._known(slices, snapshot.db_now) for slices in snapshot.windows.values())
            self._others = {key: k for key, k in zip(snapshot.windows, known) if k is not None}
            self._other_levels = snapshot.levels
            if levels is not None:
                self._levels_pushed_at = mono
            if prune:
                self._pruned_at = mono
            self.synced_at = time.monotonic()

    def _known(self, slices: dict[int, int], now: float) -> tuple[int, float, tuple[tuple[float, int], ...]] | None:
        """The others' slices still in the period at `now`, as `others` reads them (None: none is)."""
        leaving = tuple(sorted((leaves, n) for start, n in slices.items() if (leaves := start + self.slice + self.period) > now))
        return (sum(n for _, n in leaving), leaving[0][0], leaving) if leaving else None

    async def run(self) -> None:
        """Sync every `sync_seconds` until cancelled; then a last sync that pushes what is left and takes
        this replica's levels away (blocking: the server is stopping, its store still open), unless the
        store was not answering (a stop must not wait on it; the levels age out)."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.sync)
                    if self._failing:
                        log.warning("fleet limits: the store answers again; the fleet's counts are current")
                        self._failing = False
                except asyncio.CancelledError:
                    raise
                except Exception:
                    if not self._failing:
                        log.exception("fleet limits: cannot sync through the store (each replica now counts mostly alone)")
                        self._failing = True
                await asyncio.sleep(self.sync_seconds)
        except asyncio.CancelledError:
            if not self._failing:
                self.close()
            raise

    def close(self) -> None:
        """The last sync, and this replica's levels removed; failures logged, never raised."""
        with self._lock:
            self._levels.clear()
            self._levels_changed = True
        try:
            self.sync()
            self.counts.remove(self.name)
        except Exception:
            log.exception("fleet limits: the last sync")


class FleetRateLimiter(strategies.MovingWindowRateLimiter):
    """The `limits` library's moving-window limiter over this process's memory (what this replica
    admitted, counted exactly), with `view`'s count of the other replicas added: a hit needs room for
    its cost beside both. It is the library's limiter (`hit`, `test`, `get_window_stats`), so `Admission`
    and `LoginThrottle` count with it as with the library's. Identifiers: (bucket, subject...), every
    item per `view.period` (a minute). `view` None: the library's limiter, nothing added."""

    def __init__(self, view: FleetView | None = None):
        super().__init__(storage.MemoryStorage())
        self.view = view

    def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        view = self.view
        if view is None:
            return super().hit(item, *identifiers, cost=cost)
        bucket, subject = _fleet_key(identifiers)
        # the library's hit (its moving-window storage, one call), with room for the others' count taken
        # from the limit: `cost` entries are added when this replica's window holds at most
        # amount - others - cost of them
        limit = item.amount - view.others(bucket, subject)
        if not self.storage.acquire_entry(item.key_for(*identifiers), limit, item.get_expiry(), amount=cost):  # type: ignore[attr-defined]
            return False
        view.add(bucket, subject, cost)
        return True

    def test(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        others = self.view.others(*_fleet_key(identifiers)) if self.view is not None else 0
        return super().test(item, *identifiers, cost=cost + others)

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        """The library's stats of this replica's window, with the others' count taken from `remaining`,
        and a `reset_time` no earlier than when one more hit fits beside the others' known slices."""
        stats = super().get_window_stats(item, *identifiers)
        if self.view is None:
            return stats
        bucket, subject = _fleet_key(identifiers)
        others = self.view.others(bucket, subject)
        if not others:
            return stats
        mine = item.amount - stats.remaining
        room = item.amount - 1 - mine  # what the others' count must fall to for one more hit (this replica's held)
        reset = stats.reset_time  # this replica's window is full: when its oldest hit leaves
        if room >= 0:
            reset = time.time() + self.view.others_fall_to(bucket, subject, room)
        return WindowStats(reset, max(0, stats.remaining - others))


def _fleet_key(identifiers: tuple[str, ...]) -> tuple[str, str]:
    return identifiers[0], ":".join(identifiers[1:])


def fleet_view(server: ServerConfig, counts: FleetCounts, replica: str) -> FleetView | None:
    """This replica's view of the fleet's `counts` (`store.fleet.counts`, `[server] fleet_limits`), None when each
    replica counts alone. `FleetView.run` syncs it (the composition root starts it with the others)."""
    if not server.fleet_limits:
        return None
    return FleetView(counts, replica, server.limits_sync_seconds)
