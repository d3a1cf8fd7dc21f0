"""The store's data-rights queries: a user deletes one of its responses, an operator forgets a key,
retention deletes what is older than `[store] retain_days`. Mixed into `Store`.

Deleting a response deletes its ratings in the same transaction, so no later training run, replay,
report or critic pre-training can read them (they all read through the store). Versions already
trained on them stay as they are: their checkpoints are not retrained.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from liveloop.store.models import ApiKey, Feedback, Response, utcnow


@dataclass(frozen=True)
class Deleted:
    responses: int
    ratings: int


class RightsQueries:
    _session: Any
    _add_event: Any  # OperatorQueries'

    def delete_response(self, response_id: str, api_key_id: str) -> Deleted:
        """Delete a response served to `api_key_id`, with its ratings; Deleted(0, 0) when there is no
        such response for that key (the caller answers 404 either way: ids do not leak)."""
        with self._session.begin() as s:
            owner = s.scalar(select(Response.api_key_id).where(Response.id == response_id))
            if owner != api_key_id:
                return Deleted(0, 0)
            ratings = s.execute(delete(Feedback).where(Feedback.response_id == response_id)).rowcount
            s.execute(delete(Response).where(Response.id == response_id))
            return Deleted(1, ratings or 0)

    def forget_key(self, api_key_id: str, admin_key_id: str | None = None) -> Deleted:
        """Delete every response served to `api_key_id` and every rating it gave, record when, and
        log an operator event; one transaction."""
        with self._session.begin() as s:
            ids = select(Response.id).where(Response.api_key_id == api_key_id).scalar_subquery()
            ratings = s.execute(delete(Feedback).where(Feedback.response_id.in_(ids))).rowcount or 0
            ratings += s.execute(delete(Feedback).where(Feedback.api_key_id == api_key_id)).rowcount or 0
            responses = s.execute(delete(Response).where(Response.api_key_id == api_key_id)).rowcount or 0
            row = s.get(ApiKey, api_key_id)
            now = utcnow()
            if row is None:
                s.add(ApiKey(key_id=api_key_id, quarantined=False, forgotten_at=now, updated_at=now))
            else:
                row.forgotten_at, row.updated_at = now, now
            self._add_event(s, "forget", None, {"key_id": api_key_id, "responses": responses, "ratings": ratings}, admin_key_id)
            return Deleted(responses, ratings)

    def delete_before(self, cutoff: datetime, batch: int = 1000) -> Deleted:
        """Retention: delete responses created before `cutoff` with their ratings, in transactions of
        at most `batch` responses (a big first run never holds one long lock)."""
        total = Deleted(0, 0)
        while True:
            with self._session.begin() as s:
                ids = list(s.scalars(select(Response.id).where(Response.created_at < cutoff).limit(batch)))
                if not ids:
                    return total
                ratings = s.execute(delete(Feedback).where(Feedback.response_id.in_(ids))).rowcount or 0
                s.execute(delete(Response).where(Response.id.in_(ids)))
            total = Deleted(total.responses + len(ids), total.ratings + ratings)
