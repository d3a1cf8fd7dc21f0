"""The store's checkpoint-retention queries (pinning, pruning). Mixed into `Store`; every write here is
one transaction and leaves a line in the operator event log.

A pinned version keeps its checkpoint whatever retention decides. A pruned version (`pruned_at` set)
has had its checkpoint deleted: it cannot serve again. Rows are never deleted: responses and ratings
keep pointing at the version that produced them.
"""

from __future__ import annotations

from collections.abc import Iterable
import uuid
from typing import Any

from sqlalchemy import select

from liveloop.store.models import Deployment, LearnerCursor, OperatorEvent, PolicyVersion, utcnow
from liveloop.store.status import NEVER_PRUNED


class VersionNotFound(LookupError):
    """No policy version with this number."""


class CheckpointQueries:
    _session: Any

    def deployment_id(self) -> str:
        """This deployment's random id (made by the migration that created the table; made here if a
        database lost it): it names the private namespace the deployment's shared memory lives in."""
        with self._session.begin() as s:
            row = s.scalars(select(Deployment).order_by(Deployment.created_at, Deployment.id)).first()
            if row is None:
                row = Deployment(id=uuid.uuid4().hex, created_at=utcnow())
                s.add(row)
            return row.id

    def set_pinned(self, version: int, pinned: bool, api_key_id: str | None = None) -> bool:
        """Pin (keep for ever) or unpin `version`'s checkpoint; returns whether the flag changed (a
        change is logged as a "pin" or "unpin" event). Raises VersionNotFound for an unknown version.
        Pinning a version that is already pruned does not bring its checkpoint back."""
        with self._session.begin() as s:
            row = s.get(PolicyVersion, version)
            if row is None:
                raise VersionNotFound(f"no policy version {version}")
            if bool(row.pinned) == pinned:
                return False
            row.pinned = pinned
            s.add(OperatorEvent(kind="pin" if pinned else "unpin", version=version, detail={}, api_key_id=api_key_id, created_at=utcnow()))
            return True

    def mark_pruned(self, versions: Iterable[int]) -> list[int]:
        """Record that these versions' checkpoints are being deleted, in one transaction, BEFORE the
        files go (so nothing tries to serve them). Rows that changed since the caller decided are
        skipped: version 0 (the base model), already pruned, pinned, serving/loading/published, or
        the version a learner's cursor points at (the weights it trains from and resumes from).
        Returns the versions marked, in order (the only ones the caller may delete)."""
        wanted = sorted({int(v) for v in versions if int(v) != 0})
        if not wanted:
            return []
        with self._write() as s:  # a version-state transaction (lifecycle): no activation in between
            rows = s.scalars(
                select(PolicyVersion).where(PolicyVersion.version.in_(wanted)).order_by(PolicyVersion.version).with_for_update()
            ).all()
            in_use = set(s.scalars(select(LearnerCursor.policy_version).where(LearnerCursor.policy_version.is_not(None))))
            now = utcnow()
            marked = []
            for row in rows:
                if row.pruned_at is not None or row.pinned or row.status in NEVER_PRUNED or row.version in in_use:
                    continue
                row.pruned_at = now
                marked.append(row.version)
            if marked:
                s.add(OperatorEvent(kind="prune", version=None, detail={"versions": marked}, api_key_id=None, created_at=now))
            return marked
