"""The release gate's queries: each candidate's evaluation (written by the gate once its evaluation
has run, read by the admin API, the CLI and the dashboard) and the rated replies of a version that the
reward-hacking alarms judge (monitor/hacking.py). The store's `release` part; every write is one transaction.
The gate's version-state moves (candidate, hold, promotion) are versions.py's. The gate's write
carries the leader lease's term, checked in its transaction (store/lease.py `fenced`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import case, distinct, func, select, true

import liveloop.store.codec as codec
from liveloop.store.db import Part
from liveloop.store.lease import fenced
from liveloop.store.models import Evaluation, Feedback, PolicyVersion, Response, aware, utcnow
from liveloop.store.status import VersionNotFound
from liveloop.store.operator import _only_trusted, json_safe
from liveloop.store.records import EvaluationRecord, ServedReply, VersionTraffic


class InvalidEvaluation(ValueError):
    """An evaluation the store refuses: its checks are not a list of objects, each with a name."""


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
        created_at=aware(row.created_at),
    )


class ReleaseQueries(Part):
    """The store's release part: the candidates' evaluations, the traffic each version served and the
    rated replies the alarms and the learning view judge."""

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

    # -- traffic per version, served replies ------------------------------------------------------
    def version_traffic(self, trusted: bool = False, versions: Iterable[int] | None = None) -> dict[int, VersionTraffic]:
        """Responses, ratings and positive ratings per policy version (aggregated in the database), each
        counted by episode: the turns of one agent trajectory a version served count as one response, its
        ratings as one rating (positive when one of them is: store/episodes.py); a lone response is
        an episode of one turn;
        `keys` and `votes` count each rating key once per version (its mean: records.py);
        `trusted`: counting only the ratings of keys that are not quarantined (what the guard reads);
        `versions`: only these (the release gate's candidate and live version), else all."""
        only = true() if versions is None else Response.policy_version.in_(sorted({int(v) for v in versions}))
        episode = func.coalesce(Response.root_id, Response.id)  # an agent's turns count once, as their episode
        positive = case((Feedback.reward > 0, episode), else_=None)
        with self._session() as s:
            served = dict(s.execute(
                select(Response.policy_version, func.count(distinct(episode))).where(only).group_by(Response.policy_version)
            ).all())
            # per (version, rating key): a key rates only its own responses (put_feedback) and an episode's
            # turns are one key's (linking is per key), so a version's totals are the sums over its keys
            by_key = s.execute(
                _only_trusted(
                    select(Response.policy_version, func.count(distinct(episode)), func.count(distinct(positive)))
                    .join(Response, Response.id == Feedback.response_id)
                    .where(only)
                    .group_by(Response.policy_version, Feedback.api_key_id),
                    trusted,
                )
            ).all()
            out = {v: VersionTraffic(v, n, 0, 0) for v, n in served.items()}
            for v, n, pos in by_key:  # one vote per key: its share of positive episodes
                t = out.get(v) or VersionTraffic(v, 0, 0, 0)
                out[v] = VersionTraffic(v, t.responses, t.ratings + n, t.positive + int(pos or 0), t.keys + 1, t.votes + (pos or 0) / n)
            return out

    def served_replies(self, segment: str | None, limit: int, trusted: bool = True) -> list[ServedReply]:
        """The newest `limit` responses served to adapter segment `segment` (None: responses recorded with
        no segment), newest first, each with its ratings in arrival order; `trusted` (default): without the
        ratings of quarantined keys (the learning view on the dashboard reads these)."""
        with self._session() as s:
            where = Response.segment.is_(None) if segment is None else Response.segment == segment
            q = select(Response.id, Response.policy_version, Response.response_ids).where(where)
            rows = s.execute(q.order_by(Response.created_at.desc(), Response.id.desc()).limit(max(0, int(limit)))).all()
            ratings: dict[str, list[tuple[int, int]]] = {}
            ids = [r[0] for r in rows]
            for start in range(0, len(ids), 500):
                rated = _only_trusted(
                    select(Feedback.response_id, Feedback.id, Feedback.reward).where(Feedback.response_id.in_(ids[start : start + 500])),
                    trusted,
                )
                for rid, fid, reward in s.execute(rated).all():
                    ratings.setdefault(rid, []).append((int(fid), int(reward)))
            return [
                ServedReply(rid, int(v), tuple(codec.decode_ids(blob).tolist()), tuple(sorted(ratings.get(rid, ()))))
                for rid, v, blob in rows
            ]
