"""POST /v1/completions: OpenAI's (legacy) text completions. The route only dispatches: the request
model is in `protocol`, the bodies and the stream's lifetime in `serving`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.completions.serving import ServingCompletions
from liveloop.server.edge.dependencies import completions as handler

router = APIRouter(prefix="/v1")


@router.post("/completions")
async def completions(request: Request, principal: Principal = Depends(user), h: ServingCompletions = Depends(handler)):
    return await h.handle(request, principal)
