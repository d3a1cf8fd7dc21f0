"""POST /v1/feedback: a thumbs up/down for a response this API key received; GET /v1/versions."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from liveloop.server.auth import Principal, require_user
from liveloop.server.body import parse_body
from liveloop.server.errors import APIError
from liveloop.server.schemas import FeedbackRequest
from liveloop.store import FeedbackRecord, ResponseNotFound

router = APIRouter(prefix="/v1")


@router.post("/feedback")
async def feedback(request: Request, principal: Principal = Depends(require_user)) -> dict:
    req = await parse_body(request, FeedbackRequest)
    record = FeedbackRecord(req.response_id, principal.key_id, int(req.reward), req.comment)
    try:
        stored = await request.app.state.writer.write(record)
    except ResponseNotFound:
        # Same answer whether the id does not exist or belongs to another key: ids do not leak.
        raise APIError(404, f"no response `{req.response_id}` for this API key", param="response_id") from None
    request.app.state.metrics.inc("server/feedback", reward=str(stored.reward))
    return {
        "id": stored.id,
        "object": "feedback",
        "response_id": stored.response_id,
        "reward": stored.reward,
        "comment": stored.comment,
        "created": int(stored.created_at.timestamp()),
    }


@router.get("/versions")
async def versions(request: Request, _: Principal = Depends(require_user)) -> dict:
    rows = await asyncio.to_thread(request.app.state.store.list_versions)
    return {
        "object": "list",
        "serving": request.app.state.engine.version,
        "data": [
            {
                "version": v.version,
                "parent": v.parent,
                "created": int(v.created_at.timestamp()),
                "status": v.status,
                "learner_step": v.learner_step,
                "samples_used": v.samples_used,
                "metrics": v.metrics,
                "note": v.note,
            }
            for v in rows
        ],
    }
