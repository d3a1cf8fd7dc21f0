"""Anthropic-compatible generation: POST /v1/messages, for chat applications built on the Anthropic
SDK, and POST /v1/messages/count_tokens (what its clients send before each turn). The key comes as
`x-api-key` (or Bearer); `anthropic-version`, `anthropic-beta` (any value), the `?beta=true` query and
Claude Code's own headers (`x-app`, `X-Claude-Code-Session-Id`) are accepted and not read. Errors leave in
Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`, server/edge/errors.py). The
request model is server/edge/messages/protocol.py, the bodies and the stream
server/edge/messages/serving.py. `probe` answers the reachability check Claude Code sends before its first
request (`HEAD /api/hello`; `HEAD /` too) with an empty 200, without a key: it says only that a server
is there."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import messages as handler
from liveloop.server.edge.messages.serving import ServingMessages

router = APIRouter(prefix="/v1")
probe = APIRouter()


@probe.api_route("/api/hello", methods=["GET", "HEAD"], include_in_schema=False)
@probe.api_route("/", methods=["HEAD"], include_in_schema=False)
async def hello() -> Response:
    return Response(status_code=200)


@router.post("/messages")
async def messages(request: Request, principal: Principal = Depends(user), h: ServingMessages = Depends(handler)):
    return await h.handle(request, principal)


@router.post("/messages/count_tokens")
async def messages_count_tokens(request: Request, principal: Principal = Depends(user), h: ServingMessages = Depends(handler)) -> dict:
    return await h.count_tokens(request, principal)
