"""POST /v1/chat/completions: OpenAI's chat completions. The route only dispatches: the request model
is in `protocol`, the bodies and the stream's lifetime in `serving` over the shared
`pipeline.streaming.EndpointServing` (admission, disconnects, logging before the last byte)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.chat.serving import ServingChat
from liveloop.server.edge.dependencies import chat

router = APIRouter(prefix="/v1")


@router.post("/chat/completions")
async def chat_completions(request: Request, principal: Principal = Depends(user), h: ServingChat = Depends(chat)):
    return await h.handle(request, principal)
