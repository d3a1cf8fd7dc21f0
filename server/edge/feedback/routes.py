"""POST /v1/feedback: a thumbs up/down for a response this API key received (the rule for ratings:
server/edge/feedback/serving.py). A response's deletion is server/edge/responses/routes.py's."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, require_user
from liveloop.server.edge.dependencies import feedback as handler
from liveloop.server.edge.feedback.serving import ServingFeedback

router = APIRouter(prefix="/v1")


@router.post("/feedback")
async def feedback(request: Request, principal: Principal = Depends(require_user), h: ServingFeedback = Depends(handler)) -> dict:
    return await h.rate(request, principal)
