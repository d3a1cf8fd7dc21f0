"""OpenAI-compatible generation: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.

Every response carries its `id` (the key for feedback) and the policy version that produced it, as
the extra body field `policy_version` and the header `x-liveloop-policy-version`. A response (or the
last event of a stream) is sent only after the response is durably logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from liveloop.server.auth import Principal, require_user
from liveloop.server.body import parse_body
from liveloop.server.errors import domain_error, error_body
from liveloop.server.schemas import ChatCompletionRequest, CompletionRequest
from liveloop.server.serving import Piece, Prepared, Run, Serving
from liveloop.server.text import token_bytes

router = APIRouter(prefix="/v1")
log = logging.getLogger(__name__)
VERSION_HEADER = "x-liveloop-policy-version"


def _serving(request: Request) -> Serving:
    return request.app.state.serving


@router.get("/models")
async def list_models(request: Request, _: Principal = Depends(require_user)) -> dict:
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
async def chat_completions(request: Request, principal: Principal = Depends(require_user)):
    return await _serve(request, principal, ChatCompletionRequest, "chat")


@router.post("/completions")
async def completions(request: Request, principal: Principal = Depends(require_user)):
    return await _serve(request, principal, CompletionRequest, "completion")


async def _serve(request: Request, principal: Principal, model: type, endpoint: str):
    serving = _serving(request)
    serving.admission.check_rate("chat", principal.key_id)  # raises RateLimited (429)
    req = await parse_body(request, model)
    if endpoint == "chat":
        prepared, fmt_cls = serving.prepare_chat(req, principal), _ChatFormat
    else:
        prepared, fmt_cls = serving.prepare_completion(req, principal), _CompletionFormat
    fmt = fmt_cls(serving, req, prepared)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await _stream(serving, prepared, fmt, include_usage=include_usage)
    return await _complete(serving, prepared, fmt)


async def _complete(serving: Serving, prepared: Prepared, fmt: "_Format") -> JSONResponse:
    async with serving.run(prepared) as run:
        async for _ in run:
            pass
        await serving.commit(run)
        return JSONResponse(fmt.whole(run), headers={VERSION_HEADER: str(run.version)})


async def _stream(serving: Serving, prepared: Prepared, fmt: "_Format", include_usage: bool) -> StreamingResponse:
    ctx = serving.run(prepared)
    run = await ctx.__aenter__()  # admitted now: the version goes out in the header
    closed = False

    async def release() -> None:
        nonlocal closed
        if not closed:
            closed = True
            with anyio.CancelScope(shield=True):  # a vanished client's cancellation must not cut the clean-up short
                await ctx.__aexit__(None, None, None)

    async def events() -> AsyncIterator[str]:
        try:
            first = fmt.first_chunk(run)
            if first is not None:
                yield _sse(first)
            try:
                async for piece in run:
                    if piece.text or fmt.wants_tokens:
                        yield _sse(fmt.chunk(run, piece))
            except Exception:  # the engine failed mid-stream: the status is sent, so say it in the stream
                log.exception("generation %s failed", prepared.response_id)
                yield _sse(error_body(500, "the generation failed", code="generation_failed"))
                return
            try:
                await serving.commit(run)
            except Exception as exc:  # the store refused or is full: say so in the stream (the status is sent)
                mapped = domain_error(exc)
                if mapped is None:
                    raise
                yield _sse(error_body(mapped.status, mapped.message, code=mapped.code))
                return
            yield _sse(fmt.final_chunk(run))
            if include_usage:
                yield _sse(fmt.usage_chunk(run))
            yield "data: [DONE]\n\n"
        finally:
            await release()

    return _ReleasingStream(
        events(),
        release,
        media_type="text/event-stream",
        headers={VERSION_HEADER: str(run.version), "cache-control": "no-cache"},
    )


class _ReleasingStream(StreamingResponse):
    """Releases the admitted generation however the response ends, even if the client disconnects
    before the body starts (then the body generator never runs its own `finally`)."""

    def __init__(self, content: AsyncIterator[str], release: Any, **kw: Any):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


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
        body = {**self._head(run, self.object_name), "choices": [choice], "usage": _usage(run)}
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
        return {**self._head(run, self.chunk_name), "choices": [choice]}


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
        body = {**self._head(run, self.object_name), "choices": [choice], "usage": _usage(run)}
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
        return {**self._head(run, self.chunk_name), "choices": [choice]}
