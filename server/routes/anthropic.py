"""Anthropic-compatible generation: POST /v1/messages, for chat applications built on the Anthropic
SDK. The key comes as `x-api-key` (or Bearer); `anthropic-version` is accepted and not read. Errors of
this route leave in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`,
server/errors.py). The request model is server/protocol_messages.py, the bodies and the stream
server/serving_messages.py."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.auth import Principal
from liveloop.server.routes.openai import user
from liveloop.server.serving_messages import ServingMessages

router = APIRouter(prefix="/v1")


@router.post("/messages")
async def messages(request: Request, principal: Principal = Depends(user)):
    return await ServingMessages(request).handle(principal)
