"""The release gate's queries: each candidate's evaluation (written by the gate once its evaluation
has run, read by the admin API, the CLI and the dashboard) and the rated replies of a version that the
reward-hacking alarms judge (monitor/hacking.py). Mixed into `Store`; every write is one transaction.
The gate's version-state moves (candidate, hold, promotion) are lifecycle.py's. The gate's write
carries the leader lease's term, checked in its transaction (store/lease.py `fenced`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select

from liveloop.store import codec
from liveloop.store.checkpoints import VersionNotFound
from liveloop.store.lease import fenced
from liveloop.store.models import Evaluation, Feedback, PolicyVersion, Response, utcnow
from liveloop.store.operator import _only_trusted, json_safe
from liveloop.store.records import EvaluationRecord


class InvalidEvaluation(ValueError):
    """An evaluation the store refuses: its checks are not a list of objects, each with a name."""


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def _checks(checks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(checks, (str, bytes, Mapping)) or not isinstance(checks, Sequence):
        raise InvalidEvaluation(f"an evaluation's checks are a list of objects, not {type(checks).__name__}")
    out = []
    for check in checks:
        if not isinstance(check, Mapping) or not isinstance(check.get("name"), str) or not check["name"]:
            raise InvalidEvaluation(f"each check is an object with a name: {check!r}")
        out.append(json_safe(check))
    return out


def _record(row: Evaluation) -> EvaluationRecord:
    return EvaluationRecord(
        version=row.version,
        live_version=row.live_version,
        passed=bool(row.passed),
        checks=[dict(c) for c in row.checks or []],
        seconds=float(row.seconds),
        engine_seconds=float(row.engine_seconds),
        created_at=_aware(row.created_at),
    )


class ReleaseQueries:
    _session: Any
    _write_session: Any

    # -- evaluations ------------------------------------------------------------------------------
    def record_evaluation(
        self,
        version: int,
        live_version: int | None,
        passed: bool,
        checks: Sequence[Mapping[str, Any]],
        seconds: float,
        engine_seconds: float,
        term: int | None = None,
    ) -> EvaluationRecord:
        """Store an evaluation of `version` (compared with `live_version`): one row, the version's
        latest. Raises VersionNotFound for an unknown version, InvalidEvaluation for malformed checks,
        StaleLeader (nothing stored) when `term`, the gate's, is not the leader lease's any more."""
        rows = _checks(checks)
        with self._write_session.begin() as s:
            if term is not None:
                fenced(s, term)
            if s.get(PolicyVersion, version) is None:
                raise VersionNotFound(f"no policy version {version}")
            row = Evaluation(
                version=version, live_version=live_version, passed=bool(passed), checks=rows,
                seconds=float(seconds), engine_seconds=float(engine_seconds), created_at=utcnow(),
            )
            s.add(row)
            s.flush()
            return _record(row)

    def evaluation(self, version: int) -> EvaluationRecord | None:
        """The latest evaluation of `version`, or None (not evaluated, or not yet)."""
        with self._session() as s:
            row = s.scalars(select(Evaluation).where(Evaluation.version == version).order_by(Evaluation.id.desc()).limit(1)).first()
            return _record(row) if row else None

    def evaluations(self, versions: Iterable[int]) -> dict[int, EvaluationRecord]:
        """The latest evaluation of each of `versions` that has one (the dashboard's version table)."""
        wanted = sorted({int(v) for v in versions})
        if not wanted:
            return {}
        with self._session() as s:
            latest = select(func.max(Evaluation.id)).where(Evaluation.version.in_(wanted)).group_by(Evaluation.version)
            rows = s.scalars(select(Evaluation).where(Evaluation.id.in_(latest))).all()
            return {row.version: _record(row) for row in rows}

    # -- what the reward-hacking alarms read --------------------------------------------------------
    def rated_tokens(self, version: int, limit: int = 2000, trusted: bool = True) -> list[tuple[list[int], int]]:
        """The rated responses `version` served: each one's response token ids and its rating's reward
        (the latest: a change of mind updates the rating in place), newest rating first, at most
        `limit`. `trusted` (default): without the ratings of quarantined keys, as the guard reads."""
        with self._session() as s:
            q = _only_trusted(
                select(Response.response_ids, Feedback.reward)
                .join(Response, Response.id == Feedback.response_id)
                .where(Response.policy_version == version)
                .order_by(Feedback.id.desc())
                .limit(max(0, int(limit))),
                trusted,
            )
            return [(codec.decode_ids(ids).tolist(), int(reward)) for ids, reward in s.execute(q).all()]
