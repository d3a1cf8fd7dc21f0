"""OpenAI-style errors: every failure leaves the server as `{"error": {message, type, param, code}}`
with the right status. Handlers turn validation and parsing failures into 400s, never 422 or 500;
domain exceptions (back-pressure, rate limits, a store that is down, a version that cannot be served)
are mapped to HTTP here, in one table (`domain_table`), with `Retry-After` where waiting helps. Code
below the routes raises those domain exceptions and never an HTTP status; an exception the table does
not name is a bug: a 500.

Anthropic's endpoint (`ANTHROPIC_PATHS`, POST /v1/messages) answers the same statuses in Anthropic's
shape, `{"type": "error", "error": {"type", "message"}}`, its types by status (`_ANTHROPIC_TYPES`);
every other route keeps OpenAI's."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, retry_after: int | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True)
class Answer:
    """How one domain exception leaves the server."""

    status: int
    code: str | None = None
    param: str | None = None
    message: str | None = None  # a fixed message; None: the exception's own
    retry_after: int | None = None  # a fixed Retry-After; None: the exception's `retry_after`, if it has one

    def error(self, exc: BaseException) -> APIError:
        retry_after = self.retry_after if self.retry_after is not None else getattr(exc, "retry_after", None)
        param = self.param if self.param is not None else getattr(exc, "param", None)
        code = self.code if self.code is not None else getattr(exc, "code", None)
        return APIError(self.status, self.message or str(exc), param=param, code=code, retry_after=retry_after)


@functools.cache
def domain_table() -> tuple[tuple[type[BaseException], Answer], ...]:
    """THE mapping of domain exceptions to HTTP, first match wins (imported late: the domain modules
    do not import this one, and this one must not load them at import time)."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    from liveloop.server.edge.admission import Busy, RateLimited, StorageSpent
    from liveloop.server.engines.base import AdaptersUnsupported, AdapterUnusable, EngineUnavailable
    from liveloop.server.control.activator import AlreadyServing, CheckpointUnusable, NotServable, SwapFailed, UnknownSegment
    from liveloop.server.edge.pipeline.grammar_check import CheckerUnavailable
    from liveloop.server.edge.pipeline.serving import InvalidRequest, LogFailed, UnknownModel
    from liveloop.server.edge.formats.tools import ToolsRefused
    from liveloop.server.control.weights_import import ImportFailed, ImportRefused
    from liveloop.store import RollbackRefused, ServingChanged, TransitionRefused, VersionNotFound, WriterDown, WriterFull
    from liveloop.store.rights import KeyNotFound
    from liveloop.grammar import GrammarDeadEnd

    store_down = Answer(503, "store_unavailable", message="the store is unavailable; please retry", retry_after=5)
    return (
        # back-pressure and a store that cannot take writes: retry later
        (RateLimited, Answer(429, "rate_limit_exceeded")),
        (Busy, Answer(429, "too_many_concurrent_requests")),
        (StorageSpent, Answer(429, "storage_budget_exceeded")),
        (WriterFull, Answer(503, "log_queue_full", message="the server is busy logging; please retry", retry_after=1)),
        (WriterDown, Answer(503, "log_unavailable", message="the server cannot log responses right now; please retry", retry_after=5)),
        (OperationalError, store_down),
        (InterfaceError, store_down),
        (LogFailed, Answer(503, "log_failed")),
        (EngineUnavailable, Answer(503, "engine_unavailable", retry_after=5)),
        (CheckerUnavailable, Answer(503, "grammar_checker_unavailable", retry_after=1)),  # stopping, or its child did not start
        # a request the model cannot serve as asked (the exception names its param and code)
        (UnknownModel, Answer(404, "model_not_found", param="model")),
        (InvalidRequest, Answer(400)),
        (ToolsRefused, Answer(400)),  # tools, tool choice, response format: its param and code say which
        (GrammarDeadEnd, Answer(400, "grammar_dead_end", param="response_format")),  # a pattern that matches nothing
        # policy versions: publishing, rollback, pinning
        (ImportRefused, Answer(400, param="path")),  # its code says why (not_a_regular_file, checkpoint_too_large, ...)
        (ImportFailed, Answer(503, "import_failed", retry_after=5)),  # the server could not write the copy
        (CheckpointUnusable, Answer(400, param="path")),
        (VersionNotFound, Answer(404, param="version")),
        (NotServable, Answer(409, param="version")),
        (AlreadyServing, Answer(409, param="version")),
        (SwapFailed, Answer(409, param="version")),
        (ServingChanged, Answer(409, "serving_changed", param="expect_serving")),  # before its base, RollbackRefused
        (RollbackRefused, Answer(409, param="version")),
        (TransitionRefused, Answer(409, param="version")),  # the store's version-state owner said no
        # data rights
        (KeyNotFound, Answer(404, "key_not_found", param="key_id")),
        # per-segment adapters
        (UnknownSegment, Answer(404, "segment_not_found", param="segment")),
        (AdapterUnusable, Answer(409, param="version")),
        (AdaptersUnsupported, Answer(409, "adapters_unsupported")),
    )


def domain_error(exc: BaseException) -> APIError | None:
    """The HTTP form of a domain exception, or None for one that is a bug (a 500)."""
    if isinstance(exc, APIError):
        return exc
    for cls, answer in domain_table():
        if isinstance(exc, cls):
            return answer.error(exc)
    return None


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_too_long(message: str) -> str:
    """A context-length refusal in Anthropic's words, which Claude Code reads to compact its conversation:
    "prompt is too long: N tokens > M maximum", or "input length and `max_tokens` exceed context limit:
    N + K > M, ..." when the prompt fits and max_tokens does not; another refusal naming the context (too many
    characters) after "prompt is too long: "."""
    limit = re.search(r"maximum context length is (\d+) tokens", message)
    prompt = re.search(r"the prompt has (\d+)$", message)
    room = re.search(r"(\d+) in the prompt \+ (\d+) max_tokens", message)
    if limit and prompt:
        return f"prompt is too long: {prompt[1]} tokens > {limit[1]} maximum"
    if limit and room:
        return (f"input length and `max_tokens` exceed context limit: {room[1]} + {room[2]} > {limit[1]}, "
                "decrease input length or `max_tokens` and try again")
    return f"prompt is too long: {message}" if limit else message


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    retry_after: int | None = None,
    request: Request | None = None,
) -> JSONResponse:
    """The error in the shape of the route `request` asked (Anthropic's for `ANTHROPIC_PATHS`, else OpenAI's)."""
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    if status == 408:  # the rest of the request may still be on its way: this connection is done
        headers["connection"] = "close"
    if request is not None and request.url.path in ANTHROPIC_PATHS:
        if code == "context_length_exceeded":
            message = anthropic_too_long(message)
        return JSONResponse(anthropic_error_body(status, message), status_code=status, headers=headers)
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def _union_branch(part: Any) -> bool:
    """A location part pydantic adds for a branch of a union (`str`, `function-after[...]`, `list[...]`)."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "dict", "list", "none"))


def _error(exc: ValidationError | RequestValidationError) -> dict:
    """The error to report: the first, or where it is one branch of a union (a value given as a list
    where text is also allowed, say), the error of the branch the value went furthest into."""
    errors = exc.errors()
    first = errors[0]
    loc = list(first.get("loc", ()))
    cut = next((i for i, part in enumerate(loc) if _union_branch(part)), None)
    if cut is None:
        return first
    same = [e for e in errors if list(e.get("loc", ()))[:cut] == loc[:cut]]
    return max(same, key=lambda e: len(e.get("loc", ())))


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    err = _error(exc)
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body",) and not _union_branch(p)]
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unrecognized request argument"
    elif err.get("type") == "missing":
        msg = "missing required parameter"
    return (f"{param}: {msg}" if param else msg), param


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.retry_after, request)

    async def _domain(request: Request, exc: Exception) -> JSONResponse:
        mapped = domain_error(exc)
        assert mapped is not None
        return error_response(mapped.status, mapped.message, mapped.param, mapped.code, mapped.retry_after, request)

    for cls, _ in domain_table():  # handled as answers, not as server errors (which close the connection)
        app.add_exception_handler(cls, _domain)

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, exc: ValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param, "invalid_value", request=request)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param, "invalid_value", request=request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), request=request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal server error", request=request)
