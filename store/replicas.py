"""The replica registry: one `replicas` row per serving process (migration 0009).

Every process that serves (a Ray Serve replica of `liveloop serve --config ray`, or the one process of
a plain `liveloop serve`) heartbeats its row from the server's parts (server/control/fleet.py,
`heartbeat`): what its engine serves (the base version and each segment's adapter version), how many
generations it is running, and whether its engine and writer are healthy. The fleet view
(`GET /admin/replicas`, `GET /v1/versions`'s `replicas`, `/metrics`, the dashboard's fleet panel) is
read from here, so every replica answers for the whole fleet and a single process is a fleet of one.

A row whose heartbeat is older than `down_after` seconds is "down" (its process died, e.g. `kill -9`,
or cannot reach the store); a process that stops cleanly removes its row. Ages are judged with the
reader's clock against the writer's (one machine, or hosts kept in time by NTP). Rows that have been
down for `forget_after` seconds are deleted when a replica registers.

Part of the store's `fleet` part (store/fleet.py: `store.fleet.registry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, Boolean, DateTime, Integer, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from liveloop.store.models import Base, aware, utcnow

if TYPE_CHECKING:
    from liveloop.store.db import Database


class Replica(Base):
    """A serving process: who it is, what it serves, its load and health at its last heartbeat."""

    __tablename__ = "replicas"

    replica_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "process" (plain `liveloop serve`) or "ray_serve"
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    serving_version: Mapped[int | None] = mapped_column(Integer)  # the base weights' version its engine serves
    adapter_versions: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # segment -> adapter version (None: the base)
    in_flight: Mapped[int] = mapped_column(Integer, default=0)  # generations running
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)  # its engine serves and its writer logs


@dataclass(frozen=True)
class Beat:
    """What a replica reports at a heartbeat."""

    serving_version: int | None
    adapter_versions: Mapping[str, int | None]
    in_flight: int
    healthy: bool


@dataclass(frozen=True)
class ReplicaRow:
    """A registry row as read, with its heartbeat's age and state ("up", "unhealthy" or "down")."""

    replica_id: str
    kind: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    serving_version: int | None
    adapter_versions: dict[str, int | None]
    in_flight: int
    healthy: bool
    age_seconds: float
    state: str

    @property
    def up(self) -> bool:
        return self.state != "down"


class ReplicaRegistry:
    """The `replicas` table's queries, over the store's database."""

    def __init__(self, db: Database):
        self._session = db.session

    def register(self, replica_id: str, kind: str, host: str, pid: int, beat: Beat, forget_after: float = 86400.0) -> None:
        """This replica's row, fresh (a replica id reused after a restart starts over); rows down for
        more than `forget_after` seconds go."""
        now = utcnow()
        with self._session.begin() as s:
            s.execute(delete(Replica).where(Replica.heartbeat_at < now - timedelta(seconds=forget_after)))
            row = s.get(Replica, replica_id)
            if row is None:
                row = Replica(replica_id=replica_id)
                s.add(row)
            row.kind, row.host, row.pid, row.started_at = kind, host, pid, now
            self._apply(row, beat, now)

    def beat(self, replica_id: str, beat: Beat) -> bool:
        """Record a heartbeat; False when the row is gone (deleted by an operator's clean-up, or by
        `forget_after`): the caller registers again."""
        with self._session.begin() as s:
            row = s.get(Replica, replica_id)
            if row is None:
                return False
            self._apply(row, beat, utcnow())
            return True

    def remove(self, replica_id: str) -> None:
        """A replica that stops cleanly leaves the fleet."""
        with self._session.begin() as s:
            s.execute(delete(Replica).where(Replica.replica_id == replica_id))

    def rows(self, down_after: float) -> list[ReplicaRow]:
        """Every registered replica, oldest first; a heartbeat older than `down_after` seconds is "down"."""
        now = utcnow()
        with self._session() as s:
            rows = s.scalars(select(Replica).order_by(Replica.started_at, Replica.replica_id)).all()
            return [self._row(r, now, down_after) for r in rows]

    @staticmethod
    def _apply(row: Replica, beat: Beat, now: datetime) -> None:
        row.heartbeat_at = now
        row.serving_version = beat.serving_version
        row.adapter_versions = dict(beat.adapter_versions)
        row.in_flight = int(beat.in_flight)
        row.healthy = bool(beat.healthy)

    @staticmethod
    def _row(r: Replica, now: datetime, down_after: float) -> ReplicaRow:
        heartbeat = aware(r.heartbeat_at)
        age = max(0.0, (now - heartbeat).total_seconds())
        state = "down" if age > down_after else ("up" if r.healthy else "unhealthy")
        return ReplicaRow(
            replica_id=r.replica_id, kind=r.kind, host=r.host, pid=r.pid, started_at=aware(r.started_at), heartbeat_at=heartbeat,
            serving_version=r.serving_version, adapter_versions=dict(r.adapter_versions or {}), in_flight=r.in_flight,
            healthy=bool(r.healthy), age_seconds=round(age, 3), state=state,
        )


def serving_by_version(rows: list[ReplicaRow]) -> dict[int, list[str]]:
    """Which live replicas serve each version (the base version, and each adapter version)."""
    out: dict[int, list[str]] = {}
    for r in rows:
        if not r.up:
            continue
        versions = {r.serving_version, *(v for v in r.adapter_versions.values() if v is not None)}
        for v in versions:
            if v is not None:
                out.setdefault(v, []).append(r.replica_id)
    return out
