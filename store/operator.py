"""The store's operator queries: learning pause, the operator event log (details made JSON both
databases hold: `json_safe`), and the reads the drift monitor and reports make (ratings in arrival
order with their version and tags, traffic per version, responses per time bucket). Mixed into
`Store`; every write here is one transaction. Rollback and every other version-state change are
lifecycle.py's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, case, cast, distinct, func, or_, select, true, update
from sqlalchemy.orm import Session

from liveloop.store.models import ApiKey, Feedback, LearnerControl, OperatorEvent, PolicyVersion, Response, utcnow
from liveloop.store import codec
from liveloop.store.records import OperatorEventRecord, RatingEvent, ServedReply, VersionTraffic


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

    # -- events ---------------------------------------------------------------------------------
    def _add_event(self, s: Session, kind: str, version: int | None, detail: dict[str, Any], api_key_id: str | None) -> None:
        s.add(OperatorEvent(kind=kind, version=version, detail=json_safe(detail), api_key_id=api_key_id, created_at=utcnow()))

    def set_checkpoint_digest(self, version: int, sha256: str) -> None:
        """Record the digest of a version's durable checkpoint, written after its row (in-memory publishing)."""
        with self._session.begin() as s:
            s.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(checkpoint_sha256=sha256))

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
    def rating_events(
        self, after_id: int = 0, limit: int = 10000, since: datetime | None = None, trusted: bool = False
    ) -> list[RatingEvent]:
        """Ratings past `after_id` (and at or after `since`) in arrival order, with their version and tags;
        `trusted`: without the ratings of quarantined keys (what drift and its reports read)."""
        with self._session() as s:
            q = _only_trusted(
                select(Feedback.id, Feedback.created_at, Feedback.reward, Response.policy_version, Response.request_meta)
                .join(Response, Response.id == Feedback.response_id)
                .where(Feedback.id > after_id)
                .order_by(Feedback.id)
                .limit(limit),
                trusted,
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
