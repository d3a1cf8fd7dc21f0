"""Request bodies: a size limit enforced before anything is read (413), and JSON parsed into the
edge's pydantic models with OpenAI-style 400s."""

from __future__ import annotations

import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from liveloop.server.errors import APIError, error_body

M = TypeVar("M", bound=BaseModel)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: refuse bodies over `max_bytes` by Content-Length or by counting the stream."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(error_body(413, f"request body larger than {self.max_bytes} bytes")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def parse_body(request: Request, model: type[M], empty_ok: bool = False) -> M:
    """The body as `model`; with `empty_ok`, an empty body means all defaults."""
    raw = await request.body()
    if empty_ok and not raw.strip():
        raw = b"{}"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, an int too long
        raise APIError(400, f"invalid JSON body: {str(exc)[:200]}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        from liveloop.server.errors import validation_message

        message, param = validation_message(exc)
        raise APIError(400, message, param=param, code="invalid_value") from exc
