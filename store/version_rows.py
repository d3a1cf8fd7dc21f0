"""Version rows as the versions part (store/versions.py) reads and moves them: the record a row becomes,
the lineage condition, THE status write, the lineage walks every move checks, the learner cursor's
repointing, and the errors a version-state move raises. A leaf: it imports no store part."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from liveloop.store.models import Feedback, LearnerCursor, PolicyVersion, aware, utcnow
from liveloop.store.records import VersionRecord
from liveloop.store.status import VersionStatus, check_transition

# what a learner's publish may write (offline replay: candidates, which the server never activates)
PUBLISHABLE = frozenset({VersionStatus.PUBLISHED, VersionStatus.CANDIDATE})
# versions waiting to serve that an activation overtakes (or leaves off its line): superseded by it
WAITING = (VersionStatus.PUBLISHED, VersionStatus.CANARY)


class StaleLineage(RuntimeError):
    """A learner tried to publish on top of a version that is no longer its lineage (a rollback or an
    operator's publish moved its cursor): it must reload from the store instead."""


class RollbackRefused(ValueError):
    """The target version cannot be served (unknown, failed, or without weights)."""


class ServingChanged(RollbackRefused):
    """The rollback named the version its operator saw serving (`expect_serving`), and another serves
    now (a second operator, the guard or the learner acted first): nothing was changed."""


class VersionTaken(RuntimeError):
    """The version number a writer proposed was taken by another writer first: nothing was written."""


def version_record(row: PolicyVersion) -> VersionRecord:
    return VersionRecord(
        version=row.version,
        parent=row.parent,
        created_at=aware(row.created_at),
        checkpoint_path=row.checkpoint_path,
        checkpoint_sha256=row.checkpoint_sha256,
        learner_step=row.learner_step,
        samples_used=row.samples_used,
        metrics=dict(row.metrics or {}),
        status=row.status,
        note=row.note,
        pinned=bool(row.pinned),
        pruned_at=aware(row.pruned_at) if row.pruned_at else None,
        segment=row.segment,
        weights_nonce=row.weights_nonce,
        weights_digest=row.weights_digest,
    )


def in_lineage(segment: str | None):
    """The SQL condition "this version belongs to lineage `segment`" (None: the base weights)."""
    return PolicyVersion.segment.is_(None) if segment is None else PolicyVersion.segment == segment


def move(row: PolicyVersion, status: VersionStatus) -> None:
    """THE status write: legal per TRANSITIONS, else TransitionRefused (the transaction rolls back)."""
    check_transition(row.version, row.status, status)
    row.status = status


def serving_rows(s: Session, segment: str | None) -> list[PolicyVersion]:
    """The lineage's serving rows, newest first (one, unless something went wrong before), locked."""
    q = select(PolicyVersion).where(in_lineage(segment), PolicyVersion.status == VersionStatus.SERVING)
    return list(s.scalars(q.order_by(PolicyVersion.version.desc()).with_for_update()))


def descends(s: Session, row: PolicyVersion, ancestor: int) -> bool:
    """Whether `ancestor` is on `row`'s parent chain (numbers fall along it) with no rolled-back
    version between them (a version built on one a rollback undid is off the line too)."""
    current = row
    while current.parent is not None and current.parent >= ancestor:
        if current.parent == ancestor:
            return True
        current = s.get(PolicyVersion, current.parent)
        if current is None or current.status == VersionStatus.ROLLED_BACK:
            return False
    return False


def point_cursor(s: Session, cursor_name: str, version: int) -> None:
    """The learner's lineage is `version` now; its feedback position is kept (a learner without a
    cursor row starts at the newest rating)."""
    cursor = s.get(LearnerCursor, cursor_name, with_for_update=True)
    if cursor is None:
        last = s.scalar(select(func.max(Feedback.id))) or 0
        s.add(LearnerCursor(name=cursor_name, last_feedback_id=last, policy_version=version))
    else:
        cursor.policy_version, cursor.updated_at = version, utcnow()
