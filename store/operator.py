"""The store's operator queries: learning pause, rollback, the operator event log, and the reads the
drift monitor and reports make (ratings in arrival order with their version and tags, traffic per
version, responses per time bucket). Mixed into `Store`; every write here is one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, cast, func, select, update
from sqlalchemy.orm import Session

from liveloop.store.models import Feedback, LearnerControl, LearnerCursor, OperatorEvent, PolicyVersion, Response, utcnow
from liveloop.store.records import OperatorEventRecord, RatingEvent, VersionTraffic
from liveloop.store.status import NOT_ROLLED_BACK, UNSERVABLE, VersionStatus


class StaleLineage(RuntimeError):
    """A learner tried to publish on top of a version that is no longer its lineage (a rollback
    moved its cursor): it must reload from the store instead."""


class RollbackRefused(ValueError):
    """The target version cannot be served (unknown, failed, or without weights)."""


def _event(row: OperatorEvent) -> OperatorEventRecord:
    return OperatorEventRecord(row.id, row.kind, row.version, dict(row.detail or {}), row.api_key_id, row.created_at)


class OperatorQueries:
    _session: Any
    dialect: str

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
            self._add_event(s, "pause" if paused else "resume", None, {"learner": name, "reason": reason}, api_key_id)
            return True

    def check_lineage(self, session: Session, cursor_name: str, parent: int) -> None:
        """Inside a publish transaction: the learner's cursor must still point at `parent` (a learner
        without a cursor row yet publishes its first version on any parent)."""
        row = session.get(LearnerCursor, cursor_name, with_for_update=True)
        if row is None or row.policy_version is None:
            return
        current = row.policy_version
        if current != parent:
            raise StaleLineage(f"learner {cursor_name} publishes on version {parent}, but its lineage is now {current}")

    # -- rollback -------------------------------------------------------------------------------
    def rollback_to(
        self,
        version: int,
        cursor_name: str,
        api_key_id: str | None = None,
        reason: str | None = None,
        segment: str | None = None,
    ) -> list[int]:
        """Make `version` the serving one in the store, in one transaction: every later version of the
        same lineage that served or was waiting becomes "rolled_back", any other serving row of it
        "retired", and the learner's cursor points at `version` (its feedback position is kept: the
        ratings it already consumed are not re-trained). Returns the rolled-back versions. The caller
        swaps the engine first.

        A lineage is the base weights' (segment None) or one segment's adapters. `segment` names the
        lineage to move (default: `version`'s own); a segment may also roll back to a base version,
        which then serves that segment without an adapter (the base row itself is not touched)."""
        with self._session.begin() as s:
            target = s.get(PolicyVersion, version)
            if target is None or target.status in UNSERVABLE:
                raise RollbackRefused(f"version {version} is {'unknown' if target is None else target.status}")
            if target.pruned_at is not None:
                raise RollbackRefused(f"version {version} was pruned (its checkpoint is deleted)")
            lineage = target.segment if segment is None else segment
            if target.segment is not None and target.segment != lineage:
                raise RollbackRefused(f"version {version} is segment {target.segment!r}'s adapter, not {lineage!r}'s")
            in_lineage = PolicyVersion.segment.is_(None) if lineage is None else PolicyVersion.segment == lineage
            rolled = list(
                s.scalars(
                    select(PolicyVersion.version)
                    .where(in_lineage, PolicyVersion.version > version, PolicyVersion.status.not_in(NOT_ROLLED_BACK))
                    .order_by(PolicyVersion.version)
                )
            )
            if rolled:
                s.execute(update(PolicyVersion).where(PolicyVersion.version.in_(rolled)).values(status=VersionStatus.ROLLED_BACK))
            s.execute(
                update(PolicyVersion)
                .where(in_lineage, PolicyVersion.status == VersionStatus.SERVING, PolicyVersion.version != version)
                .values(status=VersionStatus.RETIRED)
            )
            if target.segment == lineage:
                target.status = VersionStatus.SERVING
            cursor = s.get(LearnerCursor, cursor_name, with_for_update=True)
            if cursor is None:
                last = s.scalar(select(func.max(Feedback.id))) or 0
                s.add(LearnerCursor(name=cursor_name, last_feedback_id=last, policy_version=version))
            else:
                cursor.policy_version, cursor.updated_at = version, utcnow()
            detail = {"rolled_back": rolled, "learner": cursor_name, "reason": reason}
            if lineage is not None:
                detail["segment"] = lineage
            self._add_event(s, "rollback", version, detail, api_key_id)
        return rolled

    # -- events ---------------------------------------------------------------------------------
    def _add_event(self, s: Session, kind: str, version: int | None, detail: dict[str, Any], api_key_id: str | None) -> None:
        s.add(OperatorEvent(kind=kind, version=version, detail=detail, api_key_id=api_key_id, created_at=utcnow()))

    def set_checkpoint_digest(self, version: int, sha256: str) -> None:
        """Record the digest of a version's durable checkpoint, written after its row (in-memory publishing)."""
        with self._session.begin() as s:
            s.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(checkpoint_sha256=sha256))

    def abandon_version(self, version: int, cursor_name: str, parent: int, parent_cursor: int) -> None:
        """Give up `version`, whose weights were lost before their durable checkpoint existed: in ONE
        transaction it becomes "failed" and the learner's cursor goes back to `parent` at `parent_cursor`,
        so the ratings it had trained are trained again (an operator event "version_lost" says so).
        Raises StaleLineage if the cursor is no longer on `version`."""
        with self._session.begin() as s:
            self.check_lineage(s, cursor_name, version)
            s.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(status=VersionStatus.FAILED))
            self.set_cursor(cursor_name, parent_cursor, parent, session=s)
            detail = {"learner": cursor_name, "parent": parent, "cursor": parent_cursor, "reason": "no durable checkpoint and no memory"}
            self._add_event(s, "version_lost", version, detail, None)

    def record_event(self, kind: str, version: int | None = None, detail: dict[str, Any] | None = None, api_key_id: str | None = None) -> None:
        with self._session.begin() as s:
            self._add_event(s, kind, version, detail or {}, api_key_id)

    def events(self, since: datetime | None = None, limit: int = 1000) -> list[OperatorEventRecord]:
        """Operator events in time order (the newest `limit` of them)."""
        with self._session() as s:
            q = select(OperatorEvent).order_by(OperatorEvent.id.desc()).limit(limit)
            if since is not None:
                q = q.where(OperatorEvent.created_at >= since)
            return [_event(r) for r in reversed(s.scalars(q).all())]

    # -- drift monitor reads --------------------------------------------------------------------
    def rating_events(self, after_id: int = 0, limit: int = 10000, since: datetime | None = None) -> list[RatingEvent]:
        """Ratings past `after_id` (and at or after `since`) in arrival order, with their version and tags."""
        with self._session() as s:
            q = (
                select(Feedback.id, Feedback.created_at, Feedback.reward, Response.policy_version, Response.request_meta)
                .join(Response, Response.id == Feedback.response_id)
                .where(Feedback.id > after_id)
                .order_by(Feedback.id)
                .limit(limit)
            )
            if since is not None:
                q = q.where(Feedback.created_at >= since)
            return [RatingEvent(*row) for row in s.execute(q).all()]

    def last_rating_id(self, skip: int = 0) -> int:
        """The id `skip` ratings before the newest one (0 when there are not that many): where to
        start replaying the most recent `skip` ratings."""
        with self._session() as s:
            q = select(Feedback.id).order_by(Feedback.id.desc()).offset(skip).limit(1)
            return s.scalar(q) or 0

    def version_traffic(self) -> dict[int, VersionTraffic]:
        """Responses, ratings and positive ratings per policy version (aggregated in the database)."""
        with self._session() as s:
            served = dict(s.execute(select(Response.policy_version, func.count()).group_by(Response.policy_version)).all())
            rated = s.execute(
                select(Response.policy_version, func.count(Feedback.id), func.sum(cast(Feedback.reward, Integer)))
                .join(Response, Response.id == Feedback.response_id)
                .group_by(Response.policy_version)
            ).all()
            out = {v: VersionTraffic(v, n, 0, 0) for v, n in served.items()}
            for v, n, pos in rated:
                out[v] = VersionTraffic(v, served.get(v, 0), n, int(pos or 0))
            return out

    def responses_per_bucket(self, since: datetime, width_seconds: float) -> dict[int, int]:
        """Responses served per time bucket since `since`: {bucket start (unix seconds): count}."""
        if self.dialect == "sqlite":
            epoch = cast(func.strftime("%s", Response.created_at), Integer)
        else:
            epoch = cast(func.extract("epoch", Response.created_at), Integer)
        width = max(1, int(width_seconds))
        bucket = (epoch // width) * width
        with self._session() as s:
            rows = s.execute(select(bucket, func.count()).where(Response.created_at >= since).group_by(bucket)).all()
            return {int(b): int(n) for b, n in rows}
