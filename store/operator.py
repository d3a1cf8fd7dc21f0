"""The store's operator part: learning pause and the operator event log (details made JSON both
databases hold: `json_safe`; `add_event` writes one line in any part's transaction). Every write here
is one transaction. Rollback and every other version-state change are versions.py's; the drift
monitor's reads of ratings are the feedback part's (store/feedback.py), traffic per version the
release part's (store/release.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from liveloop.store.db import Part
from liveloop.store.lease import fenced
from liveloop.store.models import ApiKey, Feedback, LearnerControl, OperatorEvent, utcnow
from liveloop.store.records import OperatorEventRecord


def json_safe(value: Any) -> Any:
    """`value` as JSON both databases hold: numpy scalars as Python numbers, a float that is not
    finite (PostgreSQL's JSON has no NaN or infinity) as None, containers recursively."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _event(row: OperatorEvent) -> OperatorEventRecord:
    return OperatorEventRecord(row.id, row.kind, row.version, dict(row.detail or {}), row.api_key_id, row.created_at)


def _only_trusted(query, trusted: bool):
    """`query` over ratings (`Feedback`), less those of quarantined keys when `trusted`."""
    if not trusted:
        return query
    return query.outerjoin(ApiKey, ApiKey.key_id == Feedback.api_key_id).where(
        or_(ApiKey.quarantined.is_(None), ApiKey.quarantined.is_(False))
    )


def add_event(s: Session, kind: str, version: int | None, detail: dict[str, Any], api_key_id: str | None) -> None:
    """One line in the operator event log, in the caller's transaction (every part writes events here)."""
    s.add(OperatorEvent(kind=kind, version=version, detail=json_safe(detail), api_key_id=api_key_id, created_at=utcnow()))


class OperatorQueries(Part):
    """The store's operator part: learning pause and the operator event log."""

    # -- learner control --------------------------------------------------------------------------
    def learning_paused(self, name: str) -> bool:
        with self._session() as s:
            row = s.get(LearnerControl, name)
            return bool(row and row.paused)

    def set_learning_paused(self, name: str, paused: bool, reason: str | None = None, api_key_id: str | None = None) -> bool:
        """Pause or resume learner `name`; returns whether the state changed (logged as an event)."""
        with self._session.begin() as s:
            row = s.get(LearnerControl, name)
            if row is None:
                row = LearnerControl(name=name, paused=False)
                s.add(row)
            if bool(row.paused) == paused:
                return False
            row.paused, row.reason, row.updated_at = paused, reason, utcnow()
            add_event(s, "pause" if paused else "resume", None, {"learner": name, "reason": reason}, api_key_id)
            return True

    # -- events ---------------------------------------------------------------------------------
    def record_event(
        self, kind: str, version: int | None = None, detail: dict[str, Any] | None = None, api_key_id: str | None = None,
        term: int | None = None,
    ) -> None:
        """One operator event. `term`: the leader lease's term of a leader's event (the drift monitor's
        alarms): StaleLeader, and nothing recorded, when the writer no longer leads (store/lease.py)."""
        with (self._write_session if term is not None else self._session).begin() as s:
            if term is not None:
                fenced(s, term)
            add_event(s, kind, version, detail or {}, api_key_id)

    def events(self, since: datetime | None = None, limit: int = 1000) -> list[OperatorEventRecord]:
        """Operator events in time order (the newest `limit` of them)."""
        with self._session() as s:
            q = select(OperatorEvent).order_by(OperatorEvent.id.desc()).limit(limit)
            if since is not None:
                q = q.where(OperatorEvent.created_at >= since)
            return [_event(r) for r in reversed(s.scalars(q).all())]
