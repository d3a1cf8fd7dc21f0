"""OpenAI-compatible generation: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Every response carries its `id` (the key for feedback) and the policy version it was admitted at, as
the extra body field `policy_version` and the header `x-liveloop-policy-version` (the header goes out
before the first token, so it can only ever name the admitted version). Which version sampled which
tokens is the extra field `version_spans`, `[{"start": 0, "end": 12, "version": 3}, ...]` over the
response's token indexes [start, end): always there in a whole response and in a stream's last chunk
(the one with `finish_reason`), one span when no swap happened (none for an empty response), more
when a `keep` swap continued the response under newer weights. A response (or the last event of a
stream) is sent only after the response is durably logged.

While a response is generated its id and key are in `Generating` (`app.state.generating`), so that
DELETE /v1/responses/{id} can answer for a response whose row has not landed yet (its tombstone keeps
the row out, store/rights.py). A forgotten key served under `[auth] forgotten_keys = "unstored"`
(`Principal.unstored`) is served as if it had sent `store: false`.

Streaming costs a write (a system call, a wake-up of the client) per event: a stream writes the first
token at once, then what arrived since its last write at most every `Serving.stream_interval` seconds;
the role-only first chunk goes out with the first token, the last events in one write. Text-only
chunks are rendered from a template made once per response (only the text is JSON-encoded).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from liveloop.server.auth import Principal, require_user
from liveloop.server.body import parse_body
from liveloop.server.errors import domain_error, error_body
from liveloop.server.schemas import ChatCompletionRequest, CompletionRequest
from liveloop.server.serving import Piece, Prepared, Run, Serving
from liveloop.server.text import token_bytes

router = APIRouter(prefix="/v1")
log = logging.getLogger(__name__)
VERSION_HEADER = "x-liveloop-policy-version"


class Generating:
    """The responses this process is generating: id -> the key it is for (event-loop only)."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    @contextlib.contextmanager
    def holding(self, response_id: str, key_id: str) -> Iterator[None]:
        self._owners[response_id] = key_id
        try:
            yield
        finally:
            self._owners.pop(response_id, None)

    def owner(self, response_id: str) -> str | None:
        return self._owners.get(response_id)


def _serving(request: Request) -> Serving:
    return request.app.state.serving


async def _user(request: Request) -> Principal:
    """`require_user` on the event loop: FastAPI hands a plain `def` dependency to a worker thread,
    a thread hop per request for a hash and a dict lookup."""
    return require_user(request)


@router.get("/models")
async def list_models(request: Request, _: Principal = Depends(_user)) -> dict:
    serving = _serving(request)
    return {
        "object": "list",
        "data": [
            {
                "id": serving.model_name,
                "object": "model",
                "created": request.app.state.started_at,
                "owned_by": "liveloop",
                "max_model_len": serving.max_model_len,
                "policy_version": serving.engine.version,
            }
        ],
    }


@router.post("/chat/completions")
async def chat_completions(request: Request, principal: Principal = Depends(_user)):
    return await _serve(request, principal, ChatCompletionRequest, "chat")


@router.post("/completions")
async def completions(request: Request, principal: Principal = Depends(_user)):
    return await _serve(request, principal, CompletionRequest, "completion")


async def _serve(request: Request, principal: Principal, model: type, endpoint: str):
    serving = _serving(request)
    serving.admission.check_rate("chat", principal.key_id)  # raises RateLimited (429)
    req = await parse_body(request, model)
    prepared = await serving.prepare(req, principal)  # length-checked on the loop, rendered and tokenized off it
    if principal.unstored:  # a forgotten key under `forgotten_keys = "unstored"`: nothing of it is logged
        prepared = dataclasses.replace(prepared, store=False)
    fmt = (_ChatFormat if endpoint == "chat" else _CompletionFormat)(serving, req, prepared)
    generating: Generating = request.app.state.generating
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await _stream(serving, prepared, fmt, include_usage=include_usage, generating=generating)
    with generating.holding(prepared.response_id, principal.key_id):
        return await _complete(request, serving, prepared, fmt)


async def _complete(request: Request, serving: Serving, prepared: Prepared, fmt: "_Format") -> Response:
    """A whole response. A client that disconnects meanwhile stops the generation (as a stream's does):
    leaving `run` aborts the engine request and logs what was generated, finish_reason "abort"."""
    async with serving.run(prepared) as run:
        if not await _unless_disconnected(request, _drain(run)):
            log.info("client of %s went away: generation stopped", prepared.response_id)
            return Response(status_code=499)  # nobody reads it
        await serving.commit(run)
        return JSONResponse(fmt.whole(run), headers={VERSION_HEADER: str(run.version)})


async def _drain(run: Run) -> None:
    async for _ in run:
        pass


async def _unless_disconnected(request: Request, work: Any) -> bool:
    """Run `work` (a coroutine) while watching the connection: True when it finished; False when the
    client disconnected first (then `work` is cancelled). Its failure is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, watcher):
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # raises the generation's failure
    return True


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(serving: Serving, prepared: Prepared, fmt: "_Format", include_usage: bool, generating: Generating) -> StreamingResponse:
    held = generating.holding(prepared.response_id, prepared.principal.key_id)
    held.__enter__()
    ctx = serving.run(prepared)
    try:
        run = await ctx.__aenter__()  # admitted now: the version goes out in the header
    except BaseException:
        held.__exit__(None, None, None)
        raise
    closed = False

    async def release() -> None:
        nonlocal closed
        if not closed:
            closed = True
            try:
                with anyio.CancelScope(shield=True):  # a vanished client's cancellation must not cut the clean-up short
                    await ctx.__aexit__(None, None, None)
            finally:
                held.__exit__(None, None, None)

    async def events() -> AsyncIterator[bytes]:
        try:
            # the role-only first chunk rides with the first write that has more (the headers went out)
            first = fmt.first_chunk(run)
            opening = b"" if first is None else _sse(first)
            text_chunk = None if fmt.wants_tokens else fmt.text_chunk_renderer(run)
            try:
                # closed here, not by the garbage collector: its reader must stop before `release`
                async with contextlib.aclosing(_gathered(run, serving.stream_interval)) as groups:
                    async for pieces in groups:
                        if text_chunk is None:
                            out = b"".join(_sse(fmt.chunk(run, piece)) for piece in pieces)
                        elif text := "".join(piece.text for piece in pieces):
                            out = text_chunk(text)
                        else:
                            continue
                        yield opening + out
                        opening = b""
            except Exception:  # the engine failed mid-stream: the status is sent, so say it in the stream
                log.exception("generation %s failed", prepared.response_id)
                yield opening + _sse(error_body(500, "the generation failed", code="generation_failed"))
                return
            try:
                await serving.commit(run)
            except Exception as exc:  # the store refused or is full: say so in the stream (the status is sent)
                mapped = domain_error(exc)
                if mapped is None:
                    raise
                yield opening + _sse(error_body(mapped.status, mapped.message, code=mapped.code))
                return
            last = opening + _sse(fmt.final_chunk(run))
            if include_usage:
                last += _sse(fmt.usage_chunk(run))
            yield last + DONE
        finally:
            await release()

    return _ReleasingStream(
        events(),
        release,
        media_type="text/event-stream",
        headers={VERSION_HEADER: str(run.version), "cache-control": "no-cache"},
    )


async def _gathered(pieces: AsyncIterator[Piece], interval: float) -> AsyncIterator[list[Piece]]:
    """The pieces of a generation in groups, each group one write to the client: the first piece at
    once (the time to first token does not change), then whatever arrived since the last write, no
    sooner than `interval` seconds after it, and the end at once. Every write is a system call and a
    wake-up of the client, per token without grouping; 0 writes each piece as it comes.

    A client that stops reading still holds the generation back: with `MAX_UNSENT` pieces waiting the
    reader stops taking more, as a blocked write did before (a swap's drain deadline then ends it)."""
    if interval <= 0:
        async for piece in pieces:
            yield [piece]
        return
    buffer: list[Piece] = []
    arrived, finished, room = asyncio.Event(), asyncio.Event(), asyncio.Event()
    failure: list[Exception] = []  # reading the pieces failed: raised after the pieces read before it

    async def pump() -> None:
        try:
            async for piece in pieces:
                buffer.append(piece)
                arrived.set()
                while len(buffer) >= MAX_UNSENT:
                    room.clear()
                    await room.wait()
        except Exception as exc:
            failure.append(exc)
        except asyncio.CancelledError:  # by the writer's clean-up, or else a failure of the generation
            failure.append(RuntimeError("reading the generation was cancelled"))
            raise
        finally:  # the writer never waits for a reader that is gone
            finished.set()
            arrived.set()

    reader = asyncio.get_running_loop().create_task(pump())
    try:
        while True:
            await arrived.wait()
            arrived.clear()
            if buffer:
                group, buffer[:] = list(buffer), []
                room.set()
                yield group
            if finished.is_set() and not buffer:
                if failure:
                    raise failure[0]
                return
            with contextlib.suppress(TimeoutError):  # the interval passes, or the generation ends first
                async with asyncio.timeout(interval):
                    await finished.wait()
    finally:
        if not reader.done():
            reader.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(reader, return_exceptions=True)


class _ReleasingStream(StreamingResponse):
    """Releases the admitted generation however the response ends, even if the client disconnects
    before the body starts (then the body generator never runs its own `finally`). A body left
    suspended at a write is closed first, so the reader of its pieces stops before the release
    closes them."""

    def __init__(self, content: AsyncIterator[bytes], release: Any, **kw: Any):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
            await self._release()


DONE = b"data: [DONE]\n\n"
MAX_UNSENT = 16  # pieces a stream reads ahead of its client (see `_gathered`)
_HOLE = "\u0000"  # stands for the text in a chunk template; the JSON of a real head never has it


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _sse(obj: Any) -> bytes:
    return f"data: {_json(obj)}\n\n".encode()


def _spans(run: Run) -> list[dict[str, int]]:
    return [{"start": a, "end": b, "version": v} for a, b, v in run.spans.all()]


def _usage(run: Run) -> dict:
    n_prompt, n_out = len(run.prepared.prompt_ids), len(run.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


class _Format:
    """The response bodies of one endpoint."""

    object_name = ""
    chunk_name = ""

    def __init__(self, serving: Serving, req: Any, prepared: Prepared):
        self.serving = serving
        self.req = req
        self.prepared = prepared
        self.wants_tokens = bool(req.return_token_ids or prepared.sampling.top_logprobs or self._logprobs_on())

    def _logprobs_on(self) -> bool:
        return False

    def _head(self, run: Run, obj: str) -> dict:
        return {
            "id": self.prepared.response_id,
            "object": obj,
            "created": self.prepared.created,
            "model": self.serving.model_name,
            "policy_version": run.version,
        }

    def usage_chunk(self, run: Run) -> dict:
        return {**self._head(run, self.chunk_name), "choices": [], "usage": _usage(run)}

    def first_chunk(self, run: Run) -> dict | None:
        return None

    def text_piece(self, run: Run, text: str) -> Piece:
        return Piece(text, [], [], None, run.version)

    def text_chunk_renderer(self, run: Run) -> Callable[[str], bytes]:
        """text -> the SSE event `chunk` makes for a text-only piece, byte for byte, with one JSON
        encoding of the text instead of the whole chunk (for a request that wants no tokens)."""
        template = _sse(self.chunk(run, self.text_piece(run, _HOLE))).decode()
        before, after = template.split(_json(_HOLE))
        head, tail = before.encode(), after.encode()
        return lambda text: head + json.dumps(text).encode() + tail


class _ChatFormat(_Format):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def _logprobs_on(self) -> bool:
        return bool(self.req.logprobs)

    def _content_logprobs(self, ids: list[int], lps: list[float], top: list | None) -> dict | None:
        if not self.req.logprobs:
            return None
        tok = self.serving.tokenizer
        entries = []
        for i, (t, lp) in enumerate(zip(ids, lps)):
            alts = top[i] if top and i < len(top) else []
            entries.append(
                {
                    "token": tok.decode([t]),
                    "logprob": lp,
                    "bytes": list(token_bytes(tok, t)),
                    "top_logprobs": [
                        {"token": tok.decode([a]), "logprob": alp, "bytes": list(token_bytes(tok, a))} for a, alp in alts
                    ],
                }
            )
        return {"content": entries}

    def whole(self, run: Run) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": run.text},
            "logprobs": self._content_logprobs(run.token_ids, run.logprobs, run.top_logprobs),
            "finish_reason": run.finish_reason,
        }
        body = {**self._head(run, self.object_name), "version_spans": _spans(run), "choices": [choice], "usage": _usage(run)}
        if self.req.return_token_ids:
            choice["token_ids"] = run.token_ids
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def first_chunk(self, run: Run) -> dict:
        choice: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        body = {**self._head(run, self.chunk_name), "choices": [choice]}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def chunk(self, run: Run, piece: Piece) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": piece.text},
            "logprobs": self._content_logprobs(piece.token_ids, piece.logprobs, piece.top_logprobs),
            "finish_reason": None,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = piece.token_ids
        return {**self._head(run, self.chunk_name), "choices": [choice]}

    def final_chunk(self, run: Run) -> dict:
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": run.finish_reason}
        return {**self._head(run, self.chunk_name), "version_spans": _spans(run), "choices": [choice]}


class _CompletionFormat(_Format):
    object_name = "text_completion"
    chunk_name = "text_completion"

    def _logprobs_on(self) -> bool:
        return self.req.logprobs is not None

    def _logprobs(self, ids: list[int], lps: list[float], top: list | None, offset: int) -> dict | None:
        if self.req.logprobs is None:
            return None
        tok = self.serving.tokenizer
        tokens = [tok.decode([t]) for t in ids]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        tops = None
        if self.req.logprobs:
            tops = [{tok.decode([a]): alp for a, alp in (top[i] if top and i < len(top) else [])} for i in range(len(ids))]
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def whole(self, run: Run) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "text": run.text,
            "logprobs": self._logprobs(run.token_ids, run.logprobs, run.top_logprobs, 0),
            "finish_reason": run.finish_reason,
        }
        body = {**self._head(run, self.object_name), "version_spans": _spans(run), "choices": [choice], "usage": _usage(run)}
        if self.req.return_token_ids:
            choice["token_ids"] = run.token_ids
            body["prompt_token_ids"] = list(self.prepared.prompt_ids)
        return body

    def chunk(self, run: Run, piece: Piece) -> dict:
        choice: dict[str, Any] = {
            "index": 0,
            "text": piece.text,
            "logprobs": self._logprobs(piece.token_ids, piece.logprobs, piece.top_logprobs, 0),
            "finish_reason": None,
        }
        if self.req.return_token_ids:
            choice["token_ids"] = piece.token_ids
        return {**self._head(run, self.chunk_name), "choices": [choice]}

    def final_chunk(self, run: Run) -> dict:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": run.finish_reason}
        return {**self._head(run, self.chunk_name), "version_spans": _spans(run), "choices": [choice]}
