"""Who leads the fleet: `Leadership`, this serving process's hold on the store's "leader" lease
(store/lease.py).

Every replica routes (its engine, its candidate engine following the store's CANARY version, the
version watcher's follower rule), but the control loops that decide and write run in the leader
only: the release gate's choice of candidate, its evaluations and its promote/hold decisions
(server/control/gate.py, `leader`), the reward-hacking alarms and the drift monitor's alarm events, guard and
quarantine (server/control/operations.py), and retention (server/control/retention.py). A plain `liveloop serve` is a fleet
of one and leads at once.

`run` renews the lease every `seconds / 3` (and a replica that does not hold it tries to take it as
often), so a leader killed with `kill -9` is replaced within `seconds + seconds / 3`. The process
counts itself the leader (`leading()`) only until `seconds` after it SENT its last successful renewal
(this process's monotonic clock, never the database's: a leader that cannot reach the store stops
leading on its own before anyone else can take over), less `MARGIN`. A clean stop releases the lease
(`release`), so the next replica takes over at its next try.

Counting itself the leader is not enough to write as the leader: a process paused (or cut off) after
it read `held_term()` and before its write would write as a leader it no longer is. So `held_term()`
is also the fencing token: the leader-only writes carry it (the gate's candidate, evaluation,
promotion and hold; the alarms' hold; the guard's rollback) and the store checks it in the write's
own transaction (store/lease.py `fenced`), refusing a deposed leader's with StaleLeader.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from liveloop.metrics import Metrics
from liveloop.store.lease import LEADER, Leases, LeaseState

log = logging.getLogger(__name__)

MARGIN = 0.1  # of the lease: this process stops counting itself the leader this much before it expires


class Leadership:
    def __init__(self, leases: Leases, replica: str, seconds: float, metrics: Metrics, name: str = LEADER):
        if seconds <= 0:
            raise ValueError(f"a lease lasts > 0 seconds, not {seconds}")
        self.leases = leases
        self.name = name
        self.holder = f"{replica}/{uuid.uuid4().hex[:8]}"  # unique per start: a restarted replica is a new holder
        self.seconds = seconds
        self.renew_seconds = seconds / 3
        self.metrics = metrics
        self.state: LeaseState | None = None  # the lease at the last try
        self.term: int | None = None  # the term this process holds (None: not the leader)
        self._until = 0.0  # monotonic: leading until then

    def leading(self) -> bool:
        """Whether this process leads now (held at its last renewal, which is not too old)."""
        return time.monotonic() < self._until

    __call__ = leading

    def held_term(self) -> int | None:
        """The lease's term this process leads in now (None: it does not lead): the term its leader-only
        writes carry, refused by the store once the lease has changed hands."""
        return self.term if self.leading() else None

    def renew(self) -> LeaseState:
        """Take or renew the lease once (blocking: run it off the event loop)."""
        sent = time.monotonic()
        state = self.leases.acquire(self.name, self.holder, self.seconds)
        was = self.leading()
        self.state = state
        if state.held:
            self._until = sent + self.seconds * (1 - MARGIN)
            if not was or self.term != state.term:
                log.warning("leading the fleet (lease %r term %d, %s)", self.name, state.term, self.holder)
                self.metrics.inc("server/leader_takeovers")
            self.term = state.term
        else:
            self._until = 0.0
            if was:
                log.warning("no longer leading the fleet: %s holds the lease", state.holder)
            self.term = None
        self.metrics.set("server/leader", float(state.held))
        return state

    async def run(self) -> None:
        """Renew (or try to take) the lease every `renew_seconds` until cancelled; a store that does not
        answer is logged and tried again (leadership lapses on its own meanwhile)."""
        while True:
            try:
                await asyncio.to_thread(self.renew)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader lease")
                if not self.leading():
                    self.term = None
                    self.metrics.set("server/leader", 0.0)
            await asyncio.sleep(self.renew_seconds)

    def release(self) -> None:
        """Give the lease up (a clean stop; blocking)."""
        self._until, self.term = 0.0, None
        if self.leases.release(self.name, self.holder):
            log.info("released the fleet's leader lease")
        self.metrics.set("server/leader", 0.0)
