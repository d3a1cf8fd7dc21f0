"""POST /v1/feedback's handler: a thumbs up/down for a response this API key received, written through
the group-commit writer.

The rule for ratings: one (response, key) pair is one training sample at most. A change of mind
replaces the stored rating in place; the learner trains the latest value if it has not reached that
rating yet, and never trains the pair again after (the change is still stored and counted by the
per-version reward figures).

A session's rating (`session_id`: a client's session, server/edge/sessions.py) rates the latest turn of
this key's episode with that session's tag, as a rating of that turn would: the whole trajectory up to
it. Another key's session and an unknown one get the same 404."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from liveloop.metrics import Metrics
from liveloop.server.edge.admission import Admission
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.feedback.protocol import FeedbackRequest
from liveloop.server.edge.pipeline.serving import LogFailed
from liveloop.server.edge.principal import Principal
from liveloop.store import BatchWriter, FeedbackRecord, ResponseNotFound
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.linking import session_tag
from liveloop.store.writer import WriterSlow


class ServingFeedback:
    """Ratings: rate-limited per key, written durably before they are acknowledged."""

    def __init__(self, admission: Admission, writer: BatchWriter, metrics: Metrics, episodes: EpisodeQueries | None = None):
        self.admission = admission
        self.writer = writer
        self.metrics = metrics
        self.episodes = episodes  # where a session's latest turn is found (None: sessions are not rated)

    async def rate(self, request: Request, principal: Principal) -> dict[str, Any]:
        self.admission.check_rate("feedback", principal.key_id)
        req = await parse_body(request, FeedbackRequest)
        if principal.unstored:  # a forgotten key: nothing of it is stored (the writer would drop it too)
            raise _not_found(req)
        response_id = req.response_id or await self._session_turn(req, principal)
        record = FeedbackRecord(response_id, principal.key_id, int(req.reward), req.comment)
        try:
            stored = await self.writer.write(record)
        except WriterSlow as exc:  # the store is stalled: not acknowledged (it may still land; a retry revises it)
            raise LogFailed.too_slow(exc) from exc
        except ResponseNotFound:
            # Same answer whether the id does not exist or belongs to another key: ids do not leak.
            raise _not_found(req) from None
        self.metrics.inc("server/feedback", reward=str(stored.reward))
        return {
            "id": stored.id,
            "object": "feedback",
            "response_id": stored.response_id,
            "session_id": req.session_id,
            "reward": stored.reward,
            "comment": stored.comment,
            "created": int(stored.created_at.timestamp()),
            "revisions": stored.revisions,
        }

    async def _session_turn(self, req: FeedbackRequest, principal: Principal) -> str:
        """The latest turn of this key's session `req.session_id` (404: none)."""
        assert req.session_id is not None
        found = None
        if self.episodes is not None:
            found = await asyncio.to_thread(self.episodes.session_turn, principal.key_id, session_tag(req.session_id))
        if found is None:
            raise _not_found(req)
        return found


def _not_found(req: FeedbackRequest) -> APIError:
    """The same answer whether the id does not exist or belongs to another key: ids do not leak."""
    if req.session_id is not None:
        return APIError(404, f"no session `{req.session_id}` for this API key", param="session_id")
    return APIError(404, f"no response `{req.response_id}` for this API key", param="response_id")
