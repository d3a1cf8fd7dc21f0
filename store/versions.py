"""The store's `versions` part (`VersionQueries`), the owner of version state: a policy version's
number and status are written here and nowhere else; also the reads of version rows and learner
cursors, and the checkpoints' pinning and pruning.

Every move is ONE transaction that takes the version-state write lock before it reads
(`Database.version_transaction`: SQLite `BEGIN IMMEDIATE`; PostgreSQL a transaction-scoped advisory
lock every version-state writer takes, and `FOR UPDATE` on the rows it reads), checks inside it that
each status it writes is a legal move (`status.TRANSITIONS`, else `TransitionRefused`) and that the
lineage holds, then writes. So two writers never decide on the same stale read: a rollback, an
activation, an operator's publish and a learner's publish are serialised, and whatever loses a race
is refused rather than applied.

The moves: numbering (`add_version`, `publish_version`: max + 1 inside the inserting transaction, or a
proposed number, `VersionTaken` if taken), activation (`check_activation`, `activate_version`), the
release gate (`start_canary`, `hold_version`), rollback (`rollback_to`), giving a version up
(`fail_version`, `abandon_version`, `reject_weights`, `recover_serving`), `supersede` and
`drop_activation`; each method's docstring says what it moves.

Fenced moves: the leader's decisions (`start_canary`, `activate_version` of a candidate, `hold_version`,
the guard's `rollback_to`; `check_activation` asks ahead) take `term`, the leader lease's term
(server/control/leader.py), checked first in the same transaction (store/lease.py `fenced`): a deposed
leader's decision raises StaleLeader and writes nothing. `term` None: not a leader's write.
Row helpers and the errors raised here: store/version_rows.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from liveloop.store.db import Part
from liveloop.store.models import LearnerCursor, OperatorEvent, PolicyVersion, utcnow
from liveloop.store.operator import add_event
from liveloop.store.records import Activation, VersionRecord
from liveloop.store.status import (
    ACTIVATABLE, NEVER_PRUNED, NOT_ROLLED_BACK, UNSERVABLE, TransitionRefused, VersionNotFound, VersionStatus,
)
from liveloop.store.version_rows import (
    PUBLISHABLE, WAITING, RollbackRefused, ServingChanged, StaleLineage, VersionTaken, descends, in_lineage, move,
    point_cursor, serving_rows, version_record,
)

__all__ = ["RollbackRefused", "ServingChanged", "StaleLineage", "VersionQueries", "VersionTaken"]


class VersionQueries(Part):
    """The store's versions part: the reads of version rows and learner cursors, the checkpoints'
    pinning and pruning, and every version-state write (the moves below)."""

    # -- reads -----------------------------------------------------------------------------------------
    def ensure_base_version(self, checkpoint_path: str | None, note: str = "base model") -> VersionRecord:
        """Version 0 is the model the server starts from; created once, on first start."""
        existing = self.get_version(0)
        if existing is not None:
            return existing
        try:
            return self.add_version(0, parent=None, checkpoint_path=checkpoint_path, note=note)
        except VersionTaken:  # another process created it first
            return self.get_version(0)

    def get_version(self, version: int) -> VersionRecord | None:
        with self._session() as s:
            row = s.get(PolicyVersion, version)
            return version_record(row) if row else None

    def list_versions(self) -> list[VersionRecord]:
        with self._session() as s:
            rows = s.scalars(select(PolicyVersion).order_by(PolicyVersion.version)).all()
            return [version_record(r) for r in rows]

    def versions_page(self, after: int | None, limit: int, descending: bool = False) -> list[VersionRecord]:
        """Up to `limit` versions following version `after` (None: from the first) in version order
        (`descending`: newest first): one page of a list API."""
        order = PolicyVersion.version.desc() if descending else PolicyVersion.version
        query = select(PolicyVersion).order_by(order).limit(limit)
        if after is not None:
            query = query.where(PolicyVersion.version < after if descending else PolicyVersion.version > after)
        with self._session() as s:
            return [version_record(r) for r in s.scalars(query).all()]

    def latest_version(self, status: VersionStatus = VersionStatus.SERVING, segment: str | None = None) -> VersionRecord | None:
        """The newest version with `status` among the base weights' (segment None) or one segment's adapters."""
        with self._session() as s:
            row = s.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.status == status, in_lineage(segment))
                .order_by(PolicyVersion.version.desc())
            ).first()
            return version_record(row) if row else None

    def canary_version(self, segment: str | None = None) -> VersionRecord | None:
        """The lineage's candidate under the release gate (CANARY; at most one), or None."""
        return self.latest_version(VersionStatus.CANARY, segment)

    def serving_adapters(self) -> dict[str, VersionRecord]:
        """Each segment's serving adapter version (segments served by the base have none)."""
        with self._session() as s:
            rows = s.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.status == VersionStatus.SERVING, PolicyVersion.segment.is_not(None))
                .order_by(PolicyVersion.version)
            ).all()
            return {r.segment: version_record(r) for r in rows}

    def cursor_version(self, name: str) -> int | None:
        with self._session() as s:
            row = s.get(LearnerCursor, name)
            return row.policy_version if row else None

    def versions_with_status(self, status: VersionStatus, after: int = -1, segment: str | None = None) -> list[VersionRecord]:
        """Versions with `status` past `after`, among the base weights' (segment None) or one segment's adapters."""
        with self._session() as s:
            rows = s.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.status == status, PolicyVersion.version > after, in_lineage(segment))
                .order_by(PolicyVersion.version)
            ).all()
            return [version_record(r) for r in rows]

    def set_cursor(self, name: str, last_feedback_id: int, policy_version: int | None, session: Session) -> None:
        row = session.get(LearnerCursor, name)
        if row is None:
            session.add(LearnerCursor(name=name, last_feedback_id=last_feedback_id, policy_version=policy_version))
        else:
            row.last_feedback_id = last_feedback_id
            row.policy_version = policy_version
            row.updated_at = utcnow()

    # -- checkpoints: pinning and pruning ------------------------------------------------------------
    """A pinned version keeps its checkpoint whatever retention decides. A pruned version (`pruned_at`
    set) has had its checkpoint deleted: it cannot serve again. Rows are never deleted: responses and
    ratings keep pointing at the version that produced them."""

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
        with self.db.version_transaction() as s:  # no activation in between
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

    def set_checkpoint_digest(self, version: int, sha256: str) -> None:
        """Record the digest of a version's durable checkpoint, written after its row (in-memory publishing)."""
        with self._session.begin() as s:
            s.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(checkpoint_sha256=sha256))

    # -- numbers and rows ---------------------------------------------------------------------------
    def next_version(self) -> int:
        """The number the next insert would get now: a proposal only (the inserting transaction decides)."""
        with self._session() as s:
            return (s.scalar(select(func.max(PolicyVersion.version))) or 0) + 1

    def _number(self, s: Session, version: int | None) -> int:
        if version is None:
            top = s.scalar(select(func.max(PolicyVersion.version)))
            return 0 if top is None else top + 1
        if s.get(PolicyVersion, version) is not None:
            raise VersionTaken(f"version {version} exists already")
        return version

    def _insert(self, s: Session, version: int | None, status: VersionStatus, **row: Any) -> PolicyVersion:
        record = PolicyVersion(version=self._number(s, version), created_at=utcnow(), status=VersionStatus(status), **row)
        s.add(record)
        s.flush()
        return record

    def add_version(
        self,
        version: int | None,
        *,
        parent: int | None,
        checkpoint_path: str | None,
        checkpoint_sha256: str | None = None,
        learner_step: int = 0,
        samples_used: int = 0,
        metrics: dict[str, Any] | None = None,
        status: VersionStatus = VersionStatus.SERVING,
        note: str | None = None,
        segment: str | None = None,
        weights_nonce: str | None = None,
        weights_digest: str | None = None,
    ) -> VersionRecord:
        """Insert a version row as `status` (the base model's, an operator's LOADING checkpoint, test
        fixtures); `version` None: the next number, allocated in this transaction. Raises VersionTaken."""
        with self.db.version_transaction() as s:
            row = self._insert(
                s, version, status, parent=parent, checkpoint_path=checkpoint_path, checkpoint_sha256=checkpoint_sha256,
                learner_step=learner_step, samples_used=samples_used, metrics=metrics or {}, note=note, segment=segment,
                weights_nonce=weights_nonce, weights_digest=weights_digest,
            )
            return version_record(row)

    def publish_version(
        self,
        version: int | None = None,
        *,
        parent: int,
        checkpoint_path: str | Callable[[int], str],
        checkpoint_sha256: str | None,
        learner_step: int,
        samples_used: int,
        metrics: dict[str, Any],
        cursor_name: str,
        last_feedback_id: int,
        status: VersionStatus = VersionStatus.PUBLISHED,
        segment: str | None = None,
        weights_nonce: str | None = None,
        weights_digest: str | None = None,
    ) -> VersionRecord:
        """A learner's new version and its cursor, in ONE transaction: a crash leaves either both or
        neither, so a restarted learner resumes from the last published version with nothing lost and
        nothing trained twice. `version` None: the next number, allocated here (the record says which);
        `checkpoint_path` may then be a function of that number, called inside this transaction before
        the row is written (it moves the checkpoint to where the number names it, and returns that
        path; if it raises, nothing is written). `weights_nonce` / `weights_digest`: what the transport's
        handle names (the weights are complete before the row exists; receivers verify them against
        it). Raises StaleLineage if a rollback or an operator's publish moved the cursor off `parent`, and
        VersionTaken if a proposed `version` exists already."""
        if VersionStatus(status) not in PUBLISHABLE:
            raise TransitionRefused(f"a learner publishes {' or '.join(sorted(PUBLISHABLE))} versions, not {status}")
        with self.db.version_transaction() as s:
            self.check_lineage(s, cursor_name, parent)
            if callable(checkpoint_path):
                version = self._number(s, version)
                checkpoint_path = checkpoint_path(version)
            row = self._insert(
                s, version, status, parent=parent, checkpoint_path=checkpoint_path, checkpoint_sha256=checkpoint_sha256,
                learner_step=learner_step, samples_used=samples_used, metrics=metrics, segment=segment,
                weights_nonce=weights_nonce, weights_digest=weights_digest,
            )
            self.set_cursor(cursor_name, last_feedback_id, row.version, session=s)
            return version_record(row)

    def advance_cursor(self, cursor_name: str, last_feedback_id: int, version: int) -> None:
        """A learner's cursor moves past ratings it consumed without a new version (every step since its
        last version was skipped), still on `version`, in ONE transaction with the lineage check. Raises
        StaleLineage if a rollback moved the cursor off `version`."""
        with self.db.version_transaction() as s:
            self.check_lineage(s, cursor_name, version)
            self.set_cursor(cursor_name, last_feedback_id, version, session=s)

    def check_lineage(self, session: Session, cursor_name: str, parent: int) -> None:
        """Inside a version-state transaction: the learner's cursor must still point at `parent` (a
        learner without a cursor row yet publishes its first version on any parent)."""
        row = session.get(LearnerCursor, cursor_name, with_for_update=True)
        if row is None or row.policy_version is None:
            return
        current = row.policy_version
        if current != parent:
            raise StaleLineage(f"learner {cursor_name} publishes on version {parent}, but its lineage is now {current}")

    # -- activation ---------------------------------------------------------------------------------
    def _activatable(self, s: Session, version: int) -> tuple[PolicyVersion, list[PolicyVersion]]:
        """`version`'s row and its lineage's serving rows, if it may serve now; else TransitionRefused
        (VersionNotFound for an unknown number)."""
        row = s.get(PolicyVersion, version, with_for_update=True)
        if row is None:
            raise VersionNotFound(f"no policy version {version}")
        if row.status not in ACTIVATABLE:
            raise TransitionRefused(f"version {version} is {row.status}: only a published or loading version is activated")
        if row.pruned_at is not None:
            raise TransitionRefused(f"version {version} was pruned")
        serving = serving_rows(s, row.segment)
        if serving and not descends(s, row, serving[0].version):
            raise TransitionRefused(
                f"version {version} (parent {row.parent}) does not descend from the serving version {serving[0].version}: "
                "its lineage was rolled back or replaced"
            )
        return row, serving

    def check_activation(self, version: int, term: int | None = None) -> VersionRecord:
        """The owner's word, asked under the activation lock before an engine loads `version`: it may
        serve now (published or loading, not pruned, descends from the serving version; so nothing was
        rolled back under it and nothing newer serves). Raises TransitionRefused or VersionNotFound;
        StaleLeader when `term` (a promotion's) is not the leader lease's any more."""
        with self.db.version_transaction(term) as s:
            row, _ = self._activatable(s, version)
            return version_record(row)

    def activate_version(self, version: int, cursor_name: str | None = None, term: int | None = None) -> Activation:
        """`version` serves (the engine has swapped it in), checked again inside this transaction: it
        becomes SERVING, the lineage's serving version RETIRED, and every PUBLISHED (or CANARY) version
        of the lineage it overtakes or leaves off its line SUPERSEDED. A CANARY `version` is the release
        gate's promotion: the PUBLISHED versions trained on from it stay, the newest is the next candidate. `cursor_name` (an operator's publish):
        that learner's cursor points at `version` now, its feedback position kept, so the learner
        continues from the operator's weights. Raises TransitionRefused (nothing written) if a race
        was lost, VersionNotFound for an unknown number, StaleLeader when `term` (the gate's promotion)
        is not the leader lease's any more."""
        with self.db.version_transaction(term) as s:
            row, serving = self._activatable(s, version)
            previous = serving[0].version if serving else None
            for old in serving:
                move(old, VersionStatus.RETIRED)
            move(row, VersionStatus.SERVING)
            waiting = s.scalars(
                select(PolicyVersion)
                .where(in_lineage(row.segment), PolicyVersion.status.in_(WAITING), PolicyVersion.version != version)
                .order_by(PolicyVersion.version)
                .with_for_update()
            ).all()
            superseded = []
            for other in waiting:
                if other.version < version or not descends(s, other, version):
                    move(other, VersionStatus.SUPERSEDED)
                    superseded.append(other.version)
            if cursor_name is not None:
                point_cursor(s, cursor_name, version)
                add_event(s, "publish", version, {"learner": cursor_name, "previous": previous}, None)
            return Activation(version, previous, superseded)

    # -- the release gate ---------------------------------------------------------------------------
    def start_canary(self, version: int, term: int | None = None) -> VersionRecord:
        """The release gate tries `version`: PUBLISHED -> CANARY, in one transaction that also
        supersedes its lineage's older PUBLISHED versions (the candidate contains their training:
        newest wins) and logs a "canary" event. Refused (TransitionRefused, nothing written) unless it
        is PUBLISHED, not pruned, descends from its lineage's serving version, and no other version of
        its lineage is CANARY (one candidate per lineage at a time); VersionNotFound for an unknown
        number; StaleLeader when `term` is not the leader lease's any more."""
        with self.db.version_transaction(term) as s:
            row = s.get(PolicyVersion, version, with_for_update=True)
            if row is None:
                raise VersionNotFound(f"no policy version {version}")
            if row.status != VersionStatus.PUBLISHED:
                raise TransitionRefused(f"version {version} is {row.status}: only a published version becomes the candidate")
            if row.pruned_at is not None:
                raise TransitionRefused(f"version {version} was pruned")
            other = s.scalars(
                select(PolicyVersion.version).where(in_lineage(row.segment), PolicyVersion.status == VersionStatus.CANARY)
            ).first()
            if other is not None:
                raise TransitionRefused(f"version {other} is its lineage's candidate already: one at a time")
            serving = serving_rows(s, row.segment)
            if serving and not descends(s, row, serving[0].version):
                raise TransitionRefused(
                    f"version {version} (parent {row.parent}) does not descend from the serving version {serving[0].version}"
                )
            move(row, VersionStatus.CANARY)
            older = s.scalars(
                select(PolicyVersion)
                .where(in_lineage(row.segment), PolicyVersion.status == VersionStatus.PUBLISHED, PolicyVersion.version < version)
                .order_by(PolicyVersion.version)
                .with_for_update()
            ).all()
            for old in older:
                move(old, VersionStatus.SUPERSEDED)
            detail: dict[str, Any] = {"superseded": [old.version for old in older], "serving": serving[0].version if serving else None}
            if row.segment is not None:
                detail["segment"] = row.segment
            add_event(s, "canary", version, detail, None)
            return version_record(row)

    def hold_version(
        self, version: int, reason: str, cursor_name: str, detail: dict[str, Any] | None = None, term: int | None = None,
    ) -> VersionRecord:
        """The release gate refuses `version` (CANARY, or a PUBLISHED one an alarm stops first): in ONE
        transaction it becomes HELD, the PUBLISHED versions of its lineage trained on from it become
        SUPERSEDED, and if learner `cursor_name`'s lineage is `version` or one of its descendants, the
        cursor's version moves to the lineage's serving version (a segment without a serving adapter:
        the base's) while its feedback position stays: the learner reloads the live weights and goes
        on with new ratings, not the ones that made the held version. An operator event
        "release_held" records {version, reason, detail}. Refused (TransitionRefused) from any other
        status; VersionNotFound for an unknown number; StaleLeader when `term` is not the leader
        lease's any more."""
        with self.db.version_transaction(term) as s:
            row = s.get(PolicyVersion, version, with_for_update=True)
            if row is None:
                raise VersionNotFound(f"no policy version {version}")
            if row.status not in (VersionStatus.CANARY, VersionStatus.PUBLISHED):
                raise TransitionRefused(f"version {version} is {row.status}: only a candidate or a published version is held")
            move(row, VersionStatus.HELD)
            later = s.scalars(
                select(PolicyVersion)
                .where(in_lineage(row.segment), PolicyVersion.status == VersionStatus.PUBLISHED, PolicyVersion.version > version)
                .order_by(PolicyVersion.version)
                .with_for_update()
            ).all()
            superseded = []
            for other in later:
                if descends(s, other, version):
                    move(other, VersionStatus.SUPERSEDED)
                    superseded.append(other.version)
            serving = serving_rows(s, row.segment) or (serving_rows(s, None) if row.segment is not None else [])
            live = serving[0].version if serving else None
            moved = None
            cursor = s.get(LearnerCursor, cursor_name, with_for_update=True)
            if cursor is not None and cursor.policy_version is not None and live is not None:
                at = s.get(PolicyVersion, cursor.policy_version)
                if at is not None and (at.version == version or descends(s, at, version)):
                    moved = {"from": cursor.policy_version, "to": live}
                    cursor.policy_version, cursor.updated_at = live, utcnow()
            event = {
                "version": version, "reason": reason, "detail": dict(detail or {}), "superseded": superseded,
                "learner": cursor_name, "cursor": moved,
            }
            if row.segment is not None:
                event["segment"] = row.segment
            add_event(s, "release_held", version, event, None)
            return version_record(row)

    def drop_activation(self, version: int, reason: str) -> bool:
        """An activation that lost a race is dropped, never applied: logged as an "activation_dropped"
        event; a version still PUBLISHED but off its lineage's line becomes SUPERSEDED (so it is not
        tried again). Returns whether it was superseded."""
        with self.db.version_transaction() as s:
            row = s.get(PolicyVersion, version, with_for_update=True)
            superseded = False
            if row is not None and row.status == VersionStatus.PUBLISHED:
                serving = serving_rows(s, row.segment)
                if serving and not descends(s, row, serving[0].version):
                    move(row, VersionStatus.SUPERSEDED)
                    superseded = True
            add_event(s, "activation_dropped", version, {"reason": reason, "superseded": superseded}, None)
            return superseded

    def supersede(self, versions: Iterable[int]) -> list[int]:
        """Mark these versions SUPERSEDED where they are still PUBLISHED (others are left alone);
        returns those marked."""
        wanted = sorted({int(v) for v in versions})
        if not wanted:
            return []
        with self.db.version_transaction() as s:
            rows = s.scalars(select(PolicyVersion).where(PolicyVersion.version.in_(wanted)).order_by(PolicyVersion.version).with_for_update())
            done = []
            for row in rows:
                if row.status == VersionStatus.PUBLISHED:
                    move(row, VersionStatus.SUPERSEDED)
                    done.append(row.version)
            return done

    def fail_version(self, version: int) -> VersionRecord:
        """A version being activated whose weights could not be loaded (or never appeared) becomes
        FAILED. Raises TransitionRefused unless it is PUBLISHED or LOADING (a serving version is given
        up by `recover_serving` or `abandon_version`, which say what serves instead), VersionNotFound
        for an unknown number."""
        with self.db.version_transaction() as s:
            row = s.get(PolicyVersion, version, with_for_update=True)
            if row is None:
                raise VersionNotFound(f"no policy version {version}")
            if row.status not in ACTIVATABLE:
                raise TransitionRefused(f"version {version} is {row.status}: only a version being activated is failed here")
            move(row, VersionStatus.FAILED)
            return version_record(row)

    def reject_weights(self, version: int, detail: dict[str, Any]) -> bool:
        """The weights a receiver found for `version` do not match its row (digest or nonce): in ONE
        transaction it becomes FAILED (if it was being activated; a serving one is left to the
        publisher's fall-back) and a "weights_rejected" event records `detail`. Returns whether it
        was failed. Raises VersionNotFound for an unknown number."""
        with self.db.version_transaction() as s:
            row = s.get(PolicyVersion, version, with_for_update=True)
            if row is None:
                raise VersionNotFound(f"no policy version {version}")
            failed = row.status in ACTIVATABLE
            if failed:
                move(row, VersionStatus.FAILED)
            add_event(s, "weights_rejected", version, dict(detail) | {"failed": failed}, None)
            return failed

    # -- rollback -----------------------------------------------------------------------------------
    def rollback_to(
        self,
        version: int,
        cursor_name: str,
        api_key_id: str | None = None,
        reason: str | None = None,
        segment: str | None = None,
        expect_serving: int | None = None,
        event: tuple[str, dict[str, Any]] | None = None,
        term: int | None = None,
    ) -> list[int]:
        """Make `version` the serving one in the store, in one transaction: every later version of the
        same lineage that served or was waiting becomes "rolled_back", any other serving row of it
        "retired", and the learner's cursor points at `version` (its feedback position is kept: the
        ratings it already consumed are not re-trained). Returns the rolled-back versions. The caller
        swaps the engine first.

        A lineage is the base weights' (segment None) or one segment's adapters. `segment` names the
        lineage to move (default: `version`'s own); a segment may also roll back to a base version,
        which then serves that segment without an adapter (the base row itself is not touched).

        `expect_serving`: the version the caller saw serving that lineage; if another serves it now, the
        rollback is refused (ServingChanged) and nothing changes, so two operators acting on the same
        view cannot undo each other's rollback unknowingly.

        `event` (kind, detail): one more operator event about `version`, recorded in the same transaction
        (the guard's verdict), so no reader sees the rollback without its reason.

        `term`: the leader lease's term of a leader's rollback (the guard's); StaleLeader, nothing
        changed, when the lease is not in it any more. An operator's rollback passes none."""
        with self.db.version_transaction(term) as s:
            target = s.get(PolicyVersion, version, with_for_update=True)
            if target is None or target.status in UNSERVABLE:
                raise RollbackRefused(f"version {version} is {'unknown' if target is None else target.status}")
            if target.pruned_at is not None:
                raise RollbackRefused(f"version {version} was pruned (its checkpoint is deleted)")
            lineage = target.segment if segment is None else segment
            if target.segment is not None and target.segment != lineage:
                raise RollbackRefused(f"version {version} is segment {target.segment!r}'s adapter, not {lineage!r}'s")
            if expect_serving is not None:  # a segment without an adapter is served by the base
                serving = [row.version for row in serving_rows(s, lineage) or (serving_rows(s, None) if lineage is not None else [])]
                if expect_serving not in serving:
                    raise ServingChanged(f"version {expect_serving} no longer serves (now: {', '.join(f'v{v}' for v in serving) or 'none'})")
            later = s.scalars(
                select(PolicyVersion)
                .where(in_lineage(lineage), PolicyVersion.version > version, PolicyVersion.status.not_in(NOT_ROLLED_BACK))
                .order_by(PolicyVersion.version)
                .with_for_update()
            ).all()
            for row in later:
                move(row, VersionStatus.ROLLED_BACK)
            for row in serving_rows(s, lineage):
                if row.version != version:
                    move(row, VersionStatus.RETIRED)
            if target.segment == lineage and target.status != VersionStatus.SERVING:
                move(target, VersionStatus.SERVING)
            point_cursor(s, cursor_name, version)
            rolled = [row.version for row in later]
            detail = {"rolled_back": rolled, "learner": cursor_name, "reason": reason}
            if lineage is not None:
                detail["segment"] = lineage
            add_event(s, "rollback", version, detail, api_key_id)
            if event is not None:
                add_event(s, event[0], version, event[1], api_key_id)
        return rolled

    # -- versions given up --------------------------------------------------------------------------
    def abandon_version(self, version: int, cursor_name: str, parent: int, parent_cursor: int) -> None:
        """Give up `version`, whose weights were lost before their durable checkpoint existed: in ONE
        transaction it becomes "failed" and the learner's cursor goes back to `parent` at `parent_cursor`,
        so the ratings it had trained are trained again (an operator event "version_lost" says so).
        Raises StaleLineage if the cursor is no longer on `version`."""
        with self.db.version_transaction() as s:
            self.check_lineage(s, cursor_name, version)
            row = s.get(PolicyVersion, version, with_for_update=True)
            if row is not None and row.status != VersionStatus.FAILED:
                move(row, VersionStatus.FAILED)
            self.set_cursor(cursor_name, parent_cursor, parent, session=s)
            detail = {"learner": cursor_name, "parent": parent, "cursor": parent_cursor, "reason": "no durable checkpoint and no memory"}
            add_event(s, "version_lost", version, detail, None)

    def recover_serving(self, lost: Iterable[int], ancestor: int) -> None:
        """A restarting server serves `ancestor` because the versions in `lost` (the serving one and
        its parents down to `ancestor`) have no weights anywhere: in ONE transaction they become
        FAILED and `ancestor` SERVING, so the store says what serves."""
        with self.db.version_transaction() as s:
            for version in sorted({int(v) for v in lost}):
                row = s.get(PolicyVersion, version, with_for_update=True)
                if row is not None and row.status != VersionStatus.FAILED:
                    move(row, VersionStatus.FAILED)
            row = s.get(PolicyVersion, ancestor, with_for_update=True)
            if row is None:
                raise VersionNotFound(f"no policy version {ancestor}")
            for other in serving_rows(s, row.segment):
                if other.version != ancestor:
                    move(other, VersionStatus.RETIRED)
            if row.status != VersionStatus.SERVING:
                move(row, VersionStatus.SERVING)
