"""Anthropic-compatible generation: POST /v1/messages, for chat applications built on the Anthropic
SDK, and POST /v1/messages/count_tokens (what its clients send before each turn). The key comes as
`x-api-key` (or Bearer); `anthropic-version` is accepted and not read. Errors of this route leave in
Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`, server/edge/errors.py). The
request model is server/edge/messages/protocol.py, the bodies and the stream
server/edge/messages/serving.py."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import messages as handler
from liveloop.server.edge.messages.serving import ServingMessages

router = APIRouter(prefix="/v1")


@router.post("/messages")
async def messages(request: Request, principal: Principal = Depends(user), h: ServingMessages = Depends(handler)):
    return await h.handle(request, principal)


@router.post("/messages/count_tokens")
async def messages_count_tokens(request: Request, principal: Principal = Depends(user), h: ServingMessages = Depends(handler)) -> dict:
    return await h.count_tokens(request, principal)
