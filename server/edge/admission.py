"""Admission: who may start work now. Per-key request rates (chat, feedback and reads of stored
responses, a moving window from the `limits` library), caps on generations running at once per key
and in total, and each key's daily storage budget. Refusals are domain exceptions carrying how long to
wait; the edge turns them into 429 with Retry-After.

    admission.check_rate("chat", key_id)          # raises RateLimited
    await admission.check_storage(key_id)         # raises StorageSpent
    with admission.generation(key_id):            # raises Busy; the slot is held until exit
        ...

The storage budget (`[server] stored_mb_per_day`) reads the store's count of the key's bytes today
(store/keys.py, fleet-wide: every replica's writes add to it), at most every `STORAGE_FRESH_SECONDS`
per key, off the event loop: a key may pass it by what it stores within that staleness.

Fleet-wide with a `FleetView` (server/edge/fleet_limits.py, `[server] fleet_limits`): the rates count
every replica on the store, and `[server] max_concurrent_per_key_fleet` caps a key's generations across
them, each within the view's documented bounds; still in memory on the request's path. Without one
(or alone in its fleet) each limit counts this process alone. `max_concurrent_per_key` and
`max_concurrent_total` stay per replica: they share out one replica's engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator

from limits import RateLimitItemPerMinute

from liveloop.server.config import ServerConfig
from liveloop.server.edge.fleet_limits import FleetRateLimiter, FleetView

GENERATIONS = "generations"  # the fleet's level of a key's running generations
DAY_SECONDS = 86400
STORAGE_FRESH_SECONDS = 5.0  # how old a key's stored bytes, as read from the store, may be
STORAGE_KEYS_HELD = 10000  # keys whose reading is kept; past it, readings of earlier days are dropped


class RateLimited(RuntimeError):
    """The key sent more requests of this kind than its per-minute limit."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Busy(RuntimeError):
    """Too many generations are running (for this key, or in total)."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class StorageSpent(RuntimeError):
    """The key stored its day's budget of bytes."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Admission:
    def __init__(self, config: ServerConfig, fleet: FleetView | None = None, stored: Callable[[str, int], int] | None = None):
        """`fleet`: the replica's view of the fleet's counts (None: this process counts alone); `stored`:
        the bytes a key stored on a UTC day, as the store counts them (None: no storage budget)."""
        self.config = config
        self.fleet = fleet
        self._stored = stored if config.stored_mb_per_day else None
        self._readings: dict[str, tuple[int, int, float]] = {}  # key -> (day, bytes, read at)
        self._limiter = FleetRateLimiter(fleet)
        self._fleet_cap = config.max_concurrent_per_key_fleet if fleet is not None else 0
        self._rates = {
            "chat": RateLimitItemPerMinute(config.chat_requests_per_minute) if config.chat_requests_per_minute else None,
            "feedback": RateLimitItemPerMinute(config.feedback_per_minute) if config.feedback_per_minute else None,
            "reads": RateLimitItemPerMinute(config.stored_reads_per_minute) if config.stored_reads_per_minute else None,
        }
        self._running: Counter[str] = Counter()
        self.total = 0

    def check_rate(self, kind: str, key_id: str) -> None:
        item = self._rates[kind]
        if item is None or self._limiter.hit(item, kind, key_id):
            return
        reset = self._limiter.get_window_stats(item, kind, key_id).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise RateLimited(f"rate limit: at most {item.amount} {kind} requests per minute for this API key", wait)

    async def check_storage(self, key_id: str) -> None:
        """Raise StorageSpent when `key_id` has stored `stored_mb_per_day` today (UTC)."""
        if self._stored is None:
            return
        now = time.time()
        day = int(now // DAY_SECONDS)
        reading = self._readings.get(key_id)
        if reading is None or reading[0] != day or now - reading[2] > STORAGE_FRESH_SECONDS:
            reading = (day, await asyncio.to_thread(self._stored, key_id, day), now)
            if len(self._readings) >= STORAGE_KEYS_HELD:
                self._readings = {k: r for k, r in self._readings.items() if r[0] == day}
            self._readings[key_id] = reading
        budget = self.config.stored_mb_per_day * 1e6
        if reading[1] >= budget:
            wait = max(1, math.ceil((day + 1) * DAY_SECONDS - now))
            raise StorageSpent(f"storage budget: this API key stored {reading[1] / 1e6:.0f} MB of responses today (UTC), "
                               f"at most {self.config.stored_mb_per_day:g} MB a day; requests that store nothing are still served", wait)

    @contextlib.contextmanager
    def generation(self, key_id: str, n: int = 1) -> Iterator[None]:
        """Hold `n` generation slots for `key_id`, all or none (a request's n choices start together
        or not at all; the event loop is single-threaded: no lock needed)."""
        if self.total + n > self.config.max_concurrent_total:
            raise Busy(f"the server is running its maximum of {self.config.max_concurrent_total} generations")
        if self._running[key_id] + n > self.config.max_concurrent_per_key:
            raise Busy(f"at most {self.config.max_concurrent_per_key} generations at once per API key")
        if self._fleet_cap and self._running[key_id] + n + self.fleet.other_levels(GENERATIONS, key_id) > self._fleet_cap:
            raise Busy(f"at most {self._fleet_cap} generations at once per API key across the fleet")
        self._running[key_id] += n
        self.total += n
        if self._fleet_cap:
            self.fleet.set_level(GENERATIONS, key_id, self._running[key_id])
        try:
            yield
        finally:
            self.total -= n
            self._running[key_id] -= n
            if self._fleet_cap:
                self.fleet.set_level(GENERATIONS, key_id, self._running[key_id])
            if self._running[key_id] <= 0:
                del self._running[key_id]
