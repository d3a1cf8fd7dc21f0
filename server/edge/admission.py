"""Admission: who may start work now. Per-key request rates (chat and feedback, a moving window from
the `limits` library), and caps on generations running at once per key and in total. Refusals are
domain exceptions carrying how long to wait; the edge turns them into 429 with Retry-After.

    admission.check_rate("chat", key_id)          # raises RateLimited
    with admission.generation(key_id):            # raises Busy; the slot is held until exit
        ...

In memory and per server process: limits hold per replica (a cluster would share them through the
`limits` library's Redis storage, one line to change here).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Iterator

from limits import RateLimitItemPerMinute, storage, strategies

from liveloop.server.config import ServerConfig


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
    def __init__(self, config: ServerConfig):
        self.config = config
        self._limiter = strategies.MovingWindowRateLimiter(storage.MemoryStorage())
        self._rates = {
            "chat": RateLimitItemPerMinute(config.chat_requests_per_minute) if config.chat_requests_per_minute else None,
            "feedback": RateLimitItemPerMinute(config.feedback_per_minute) if config.feedback_per_minute else None,
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
        self._running[key_id] += n
        self.total += n
        try:
            yield
        finally:
            self.total -= n
            self._running[key_id] -= n
            if self._running[key_id] <= 0:
                del self._running[key_id]
