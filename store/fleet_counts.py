"""Fleet counts: what every replica admitted, shared through the store (migration 0014), so that the
per-key request rates, the per-key generation cap and the sign-in throttle hold for a whole fleet
(several `liveloop serve` processes, or Ray Serve replicas, on one store) and not per replica. The
edge's `FleetView` (server/edge/fleet_limits.py) counts locally and calls `sync` every short interval,
off the request path.

One `fleet_counts` row per (replica, bucket, subject, window_start), written only by its replica (so two
replicas never wait on each other's row), of two kinds:
- a window's count (`window_start` > 0: the window's start, unix seconds on the database's clock): how many
  of `bucket` (e.g. "chat") `subject` (e.g. a key id) the replica admitted in it. `sync` adds the
  replica's increments (an upsert: `count = count + n`);
- a level (`window_start` = `LEVEL`, 0): how many the replica holds now (generations running for a key),
  rewritten by `sync` whenever it changed and at least every few seconds while it is not zero; a level
  older than the reader's `level_fresh` seconds is a dead replica's and counts no more.

`sync` is one transaction: it writes what the replica brings, then reads what the OTHER replicas'
rows add up to per (bucket, subject, window) since `horizon` seconds ago, and their fresh levels, with
the database's clock now (`db_seconds`, as the leases use it: the replicas' clocks need not agree).
A sync with nothing to write is a read alone (SQLite: no write lock). Windows older than `KEEP_SECONDS`
are deleted by whichever replica passes `prune`.

Part of the store's `fleet` part (store/fleet.py: `store.fleet.counts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Float, Integer, String, and_, delete, func, or_, select
from sqlalchemy.orm import Mapped, mapped_column

from liveloop.store.db import dialect_insert
from liveloop.store.lease import db_seconds
from liveloop.store.models import Base

if TYPE_CHECKING:
    from liveloop.store.db import Database

LEVEL = 0  # the `window_start` of a level row
KEEP_SECONDS = 300.0  # window rows older than this are deleted (`prune`): no fleet limit looks back further


class FleetCount(Base):
    """One replica's count of one (bucket, subject) in one window, or its level (`window_start` = LEVEL)."""

    __tablename__ = "fleet_counts"

    replica: Mapped[str] = mapped_column(String(160), primary_key=True)  # the writing replica (one per process start)
    bucket: Mapped[str] = mapped_column(String(32), primary_key=True)  # what is counted: "chat", "feedback", "login", ...
    subject: Mapped[str] = mapped_column(String(64), primary_key=True)  # whose: a key id, a client address, "*"
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True, index=True)  # db unix seconds; LEVEL: a level
    count: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float)  # db unix seconds of the last write


@dataclass(frozen=True)
class FleetSnapshot:
    """The other replicas' counts as one sync read them."""

    db_now: float  # the database's clock when the sync ran (unix seconds)
    windows: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)  # (bucket, subject) -> {window start: count}
    levels: dict[tuple[str, str], int] = field(default_factory=dict)  # (bucket, subject) -> the others' fresh levels, summed


class FleetCounts:
    """The `fleet_counts` table's queries, over the store's database."""

    def __init__(self, db: Database):
        self._read = db.session
        self._write = db.write_session  # SQLite: the write lock from the first statement
        self._dialect = db.dialect

    def sync(
        self, replica: str, added: Mapping[tuple[str, str, int], int], levels: Mapping[tuple[str, str], int] | None,
        horizon: float, level_fresh: float, prune: bool = False,
    ) -> FleetSnapshot:
        """Add `replica`'s increments (`added`: (bucket, subject, window start) -> n), replace its levels
        with `levels` ((bucket, subject) -> n; None: leave them as they are; zeros are not stored), delete
        windows older than KEEP_SECONDS when `prune`; then read the other replicas' counts of the windows
        that began less than `horizon` seconds ago and their levels written in the last `level_fresh`
        seconds. One transaction."""
        writes = bool(added) or levels is not None or prune
        with (self._write if writes else self._read).begin() as s:
            now = float(s.execute(select(db_seconds())).scalar_one())
            if added:
                self._add(s, replica, added, now)
            if levels is not None:
                s.execute(delete(FleetCount).where(FleetCount.replica == replica, FleetCount.window_start == LEVEL))
                rows = [{"replica": replica, "bucket": b, "subject": sub, "window_start": LEVEL, "count": int(n), "updated_at": now}
                        for (b, sub), n in levels.items() if n > 0]
                if rows:
                    s.execute(FleetCount.__table__.insert(), rows)
            if prune:
                s.execute(delete(FleetCount).where(
                    or_(and_(FleetCount.window_start != LEVEL, FleetCount.window_start < now - KEEP_SECONDS),
                        and_(FleetCount.window_start == LEVEL, FleetCount.updated_at < now - KEEP_SECONDS)),
                ))
            return self._others(s, replica, now, horizon, level_fresh)

    def remove(self, replica: str) -> None:
        """A replica that stops cleanly takes its levels away (its window counts stay: what it admitted
        still counts against each key until the windows pass)."""
        with self._write.begin() as s:
            s.execute(delete(FleetCount).where(FleetCount.replica == replica, FleetCount.window_start == LEVEL))

    def _add(self, s: Any, replica: str, added: Mapping[tuple[str, str, int], int], now: float) -> None:
        rows = [{"replica": replica, "bucket": b, "subject": sub, "window_start": int(w), "count": int(n), "updated_at": now}
                for (b, sub, w), n in added.items() if n]
        if not rows:
            return
        insert = dialect_insert(self._dialect, FleetCount)
        upsert = insert.on_conflict_do_update(
            index_elements=["replica", "bucket", "subject", "window_start"],
            set_={"count": FleetCount.count + insert.excluded.count, "updated_at": insert.excluded.updated_at},
        )
        s.execute(upsert, rows)

    @staticmethod
    def _others(s: Any, replica: str, now: float, horizon: float, level_fresh: float) -> FleetSnapshot:
        others = FleetCount.replica != replica
        windows: dict[tuple[str, str], dict[int, int]] = {}
        for bucket, subject, window, total in s.execute(
            select(FleetCount.bucket, FleetCount.subject, FleetCount.window_start, func.sum(FleetCount.count))
            .where(others, FleetCount.window_start != LEVEL, FleetCount.window_start > now - horizon)
            .group_by(FleetCount.bucket, FleetCount.subject, FleetCount.window_start)
        ):
            windows.setdefault((bucket, subject), {})[int(window)] = int(total)
        levels = {
            (bucket, subject): int(total)
            for bucket, subject, total in s.execute(
                select(FleetCount.bucket, FleetCount.subject, func.sum(FleetCount.count))
                .where(others, FleetCount.window_start == LEVEL, FleetCount.updated_at > now - level_fresh)
                .group_by(FleetCount.bucket, FleetCount.subject)
            )
            if total
        }
        return FleetSnapshot(now, windows, levels)
