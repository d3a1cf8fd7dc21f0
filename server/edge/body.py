"""Request bodies: a size limit enforced before anything is read (413), a time limit on reading them
(`BodyDeadline`: a client that sends its headers and then trickles or withholds the body gets 408 and
its connection closed, instead of holding a request open), and JSON parsed into the edge's pydantic
models with OpenAI-style 400s."""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from liveloop.server.edge.errors import APIError, error_body

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


class BodyDeadline:
    """ASGI middleware: the whole body must arrive within `seconds` of the request's start. A read past
    it raises a 408 (answered with `connection: close`). Once the body is complete,
    reads pass through untouched (a handler waiting for the client to disconnect waits as long as it likes)."""

    def __init__(self, app: ASGIApp, seconds: float):
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        complete = False

        async def timed_receive() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise APIError(408, f"the request body did not arrive within {self.seconds:g} s", code="body_timeout") from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)


PARSE_ON_LOOP = 64 << 10  # larger bodies are parsed on a worker thread: a 1 MiB JSON costs the loop ~30 ms


async def parse_body(request: Request, model: type[M], empty_ok: bool = False) -> M:
    """The body as `model`; with `empty_ok`, an empty body means all defaults. A large body is parsed
    off the event loop."""
    raw = await request.body()
    if empty_ok and not raw.strip():
        raw = b"{}"
    if len(raw) > PARSE_ON_LOOP:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


def _parse(raw: bytes, model: type[M]) -> M:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, an int too long
        raise APIError(400, f"invalid JSON body: {str(exc)[:200]}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        from liveloop.server.edge.errors import validation_message

        message, param = validation_message(exc)
        raise APIError(400, message, param=param, code="invalid_value") from exc
