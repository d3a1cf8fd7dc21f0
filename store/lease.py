"""Leases: one named lease row per control duty (migration 0011), held by at most one process at a time.

A fleet (Ray Serve replicas, or several `liveloop serve` processes on one store) routes in every
replica, but the store-writing control loops (the release gate's decisions and evaluations, the
reward-hacking alarms, the drift monitor's alarm events, guard and quarantine, retention) run in one:
the holder of the `leader` lease (server/control/leader.py).

`Leases.acquire(name, holder, seconds)` takes, renews or takes over a lease in ONE conditional UPDATE,
atomic on both dialects (its docstring says why, and why a row rather than advisory locks).

Expiry is judged with the DATABASE's clock (`db_seconds`: PostgreSQL's `clock_timestamp()`, SQLite's
`julianday('now')`), so the replicas' clocks need not agree. `term` counts the takeovers: it grows
each time the lease changes hands (a renewal keeps it), so a holder can tell it lost the lease in
between. `release` gives it up at a clean stop (the next caller takes it at once).

Fenced writes: every leader-only write checks, in its own transaction, that the `leader` lease is
still in the term its writer leads in (`fenced`, the fencing token), else `StaleLeader` and nothing is
written.

Part of the store's `fleet` part (store/fleet.py: `store.fleet.leases`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Float, Integer, String, case, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql.functions import FunctionElement

from liveloop.store.models import Base

if TYPE_CHECKING:
    from liveloop.store.db import Database

LEADER = "leader"  # the lease of the fleet's control loops (server/control/leader.py)


class StaleLeader(RuntimeError):
    """A leader-only write carried a term the leader lease is no longer in (taken over, released or
    expired since): its writer does not lead any more, and nothing was written."""


class Lease(Base):
    """A named lease: who holds it and until when (seconds on the database's clock)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(255))  # None: released
    term: Mapped[int] = mapped_column(Integer, default=0)  # +1 each time the lease changes hands
    acquired_at: Mapped[float] = mapped_column(Float)  # when the current holder took it
    expires_at: Mapped[float] = mapped_column(Float)  # renewed by the holder; past it, anyone may take it


class db_seconds(FunctionElement):
    """The database's clock now, in unix seconds (a float, sub-second)."""

    type = Float()
    inherit_cache = True


@compiles(db_seconds, "postgresql")
def _pg_seconds(element: Any, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_seconds, "sqlite")
def _sqlite_seconds(element: Any, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True)
class LeaseState:
    """A lease as read (or as `acquire` left it): `held` says whether the asker holds it now."""

    name: str
    holder: str | None
    term: int
    expires_in: float  # seconds until it expires, on the database's clock (<= 0: expired)
    held: bool

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "holder": self.holder, "term": self.term, "expires_in": round(self.expires_in, 3), "held": self.held}


class Leases:
    """The `leases` table's queries, over the store's database."""

    def __init__(self, db: Database):
        self._write = db.write_session  # SQLite: the write lock from the first statement
        self._read = db.session

    def acquire(self, name: str, holder: str, seconds: float) -> LeaseState:
        """Take or renew `name` for `seconds` if it is free, expired or `holder`'s already. The lease as it
        stands after, `held` True when `holder` has it.

        ONE conditional UPDATE: it sets the holder and a new expiry where the row's holder is the caller
        (a renewal) or nobody, or its expiry has passed (a takeover); the row it updated, or none, is the
        answer. Both dialects make that atomic without anything else: SQLite serialises writers (the
        transaction takes the write lock at its start), and PostgreSQL's second UPDATE of the row waits
        for the first to commit and then re-checks the condition on the row it wrote (READ COMMITTED),
        so two callers never both hold it. The row is created by the first caller (an INSERT that loses
        a race to another caller's INSERT is that caller's lease). Chosen over PostgreSQL's advisory
        locks: those belong to a database session (one pooled connection kept open for ever, and held
        until the server notices the peer is gone), and SQLite has none; a row with an expiry is the
        same code on both, visible to operators, and a holder killed with `kill -9` loses it after
        `seconds`."""
        if seconds <= 0:
            raise ValueError(f"a lease lasts > 0 seconds, not {seconds}")
        now = db_seconds()
        mine = Lease.holder == holder
        with self._write.begin() as s:
            taken = s.execute(
                update(Lease)
                .where(Lease.name == name, or_(mine, Lease.holder.is_(None), Lease.expires_at < now))
                .values(
                    term=case((mine, Lease.term), else_=Lease.term + 1),
                    acquired_at=case((mine, Lease.acquired_at), else_=now),
                    holder=holder,
                    expires_at=now + seconds,
                )
                .execution_options(synchronize_session=False)
            ).rowcount
            if not taken and s.get(Lease, name) is None:
                try:
                    with s.begin_nested():
                        s.execute(insert(Lease).values(name=name, holder=holder, term=1, acquired_at=now, expires_at=now + seconds))
                except IntegrityError:  # another caller created it first: theirs
                    pass
            return self._state(s, name, holder)

    def release(self, name: str, holder: str) -> bool:
        """Give `name` up if `holder` holds it (a clean stop): the next caller takes it at once."""
        with self._write.begin() as s:
            return bool(
                s.execute(
                    update(Lease).where(Lease.name == name, Lease.holder == holder).values(holder=None, expires_at=db_seconds())
                    .execution_options(synchronize_session=False)
                ).rowcount
            )

    def get(self, name: str, holder: str | None = None) -> LeaseState | None:
        """The lease `name` as it stands (None: never taken); `held` as seen by `holder`."""
        with self._read() as s:
            return self._state(s, name, holder)

    @staticmethod
    def _state(s: Any, name: str, holder: str | None) -> LeaseState | None:
        row = s.execute(select(Lease.holder, Lease.term, Lease.expires_at - db_seconds()).where(Lease.name == name)).first()
        if row is None:
            return None
        lease_holder, term, left = row
        held = holder is not None and lease_holder == holder and left > 0
        return LeaseState(name, lease_holder, int(term), float(left), held)


def fenced(session: Any, term: int, holder: str | None = None, name: str = LEADER) -> None:
    """Inside a write transaction: lease `name` is still held in `term` (by `holder`, when given) and
    has not expired, else StaleLeader (the caller's transaction rolls back: nothing is written).

    Believing it leads is not enough for a process to write as the leader (it may have been paused, or
    cut off from the store, past its lease while another replica took over): every leader-only write
    carries the term its writer leads in and checks it here, IN ITS OWN TRANSACTION. A term names one
    holding (it grows each time the lease changes hands, and a release followed by any acquire is a
    change of hands), so the term is the fencing token. The row is read FOR SHARE: on PostgreSQL a
    takeover's UPDATE waits for the fenced transaction to end (SQLite's write lock, taken at the
    transaction's start, does so already), so the lease cannot change hands between the check and the
    commit. No column for it: the term is the row's (migration 0011)."""
    row = session.execute(
        select(Lease.holder, Lease.term, Lease.expires_at - db_seconds()).where(Lease.name == name).with_for_update(read=True)
    ).first()
    if row is None:
        raise StaleLeader(f"nobody ever held the {name!r} lease: term {term} leads nothing")
    lease_holder, lease_term, left = row
    if lease_holder is None or int(lease_term) != term or (holder is not None and lease_holder != holder):
        now = f"held by {lease_holder}" if lease_holder is not None else "released"
        raise StaleLeader(f"the {name!r} lease is in term {lease_term} ({now}), not {term}: the writer no longer leads")
    if left <= 0:
        raise StaleLeader(f"the {name!r} lease of term {term} expired {-float(left):.1f} s ago: the writer no longer leads")
