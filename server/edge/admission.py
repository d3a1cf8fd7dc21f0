"""Admission: who may start work now. Per-key request rates (chat, feedback and reads of stored
responses, a moving window from the `limits` library), and caps on generations running at once per key
and in total. Refusals are domain exceptions carrying how long to wait; the edge turns them into 429
with Retry-After.

    admission.check_rate("chat", key_id)          # raises RateLimited
    with admission.generation(key_id):            # raises Busy; the slot is held until exit
        ...

Fleet-wide with a `FleetView` (server/edge/fleet_limits.py, `[server] fleet_limits`): the rates count
every replica on the store, and `[server] max_concurrent_per_key_fleet` caps a key's generations across
them, each within the view's documented bounds; still in memory on the request's path. Without one
(or alone in its fleet) each limit counts this process alone. `max_concurrent_per_key` and
`max_concurrent_total` stay per replica: they share out one replica's engine.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Iterator

from limits import RateLimitItemPerMinute

from liveloop.server.config import ServerConfig
from liveloop.server.edge.fleet_limits import FleetRateLimiter, FleetView

GENERATIONS = "generations"  # the fleet's level of a key's running generations


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


class Admission:
    def __init__(self, config: ServerConfig, fleet: FleetView | None = None):
        """`fleet`: the replica's view of the fleet's counts (None: this process counts alone)."""
        self.config = config
        self.fleet = fleet
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
