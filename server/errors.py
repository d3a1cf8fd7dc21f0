"""OpenAI-style errors: every failure leaves the server as `{"error": {message, type, param, code}}`
with the right status. Handlers turn validation and parsing failures into 400s, never 422 or 500;
domain exceptions (back-pressure, rate limits, a store that is down) are mapped to HTTP here, in one
table, with `Retry-After` where waiting helps."""

from __future__ import annotations

import logging

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
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


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


def _domain_classes() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import InterfaceError, OperationalError

    from liveloop.server.admission import Busy, RateLimited
    from liveloop.store import WriterDown, WriterFull

    return (RateLimited, Busy, WriterFull, WriterDown, OperationalError, InterfaceError)


def domain_error(exc: BaseException) -> APIError | None:
    """The HTTP form of a domain exception, or None for one that is a bug (a 500)."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    from liveloop.server.admission import Busy, RateLimited
    from liveloop.store import WriterDown, WriterFull

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RateLimited):
        return APIError(429, str(exc), code="rate_limit_exceeded", retry_after=exc.retry_after)
    if isinstance(exc, Busy):
        return APIError(429, str(exc), code="too_many_concurrent_requests", retry_after=exc.retry_after)
    if isinstance(exc, WriterFull):
        return APIError(503, "the server is busy logging; please retry", code="log_queue_full", retry_after=1)
    if isinstance(exc, WriterDown):
        return APIError(503, "the server cannot log responses right now; please retry", code="log_unavailable", retry_after=5)
    if isinstance(exc, (OperationalError, InterfaceError)):
        return APIError(503, "the store is unavailable; please retry", code="store_unavailable", retry_after=5)
    return None


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, retry_after: int | None = None
) -> JSONResponse:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else None
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = "unrecognized request argument"
    elif err.get("type") == "missing":
        msg = "missing required parameter"
    return (f"{param}: {msg}" if param else msg), param


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.retry_after)

    async def _domain(_: Request, exc: Exception) -> JSONResponse:
        mapped = domain_error(exc)
        assert mapped is not None
        return error_response(mapped.status, mapped.message, mapped.param, mapped.code, mapped.retry_after)

    for cls in _domain_classes():  # handled as answers, not as server errors (which close the connection)
        app.add_exception_handler(cls, _domain)

    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal server error")
