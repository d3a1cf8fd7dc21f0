"""The FastAPI app of the HTTP edge: its routes, error handlers, body limits, Host allow-list and the
replica header; nothing is built here but the edge's own state (`EdgeState`): the handlers are built by
the composition root (liveloop/app.py) and attached by the lifespan it hands `create_app`
(server/edge/dependencies.py). Each route takes its one handler as a typed dependency.

Requests reach the routes only with a Host header `[server] allowed_hosts` allows (`HostAllowList`,
server/edge/hosts.py: DNS rebinding). Every response names its replica in `x-liveloop-replica`.

`check_bind` refuses, before anything starts, to listen beyond loopback with the shipped development
keys (they are public: anyone could use them).

Slow clients cannot hold connections: `create_app` bounds a request body's arrival
(`[server] body_timeout_seconds`, 408), and `uvicorn_options` gives uvicorn what bounds the headers'
(`[server] header_timeout_seconds`): uvicorn's HTTP protocols have no header timeout (a connection
that sends half a request line is kept for ever), so `HeaderDeadline` is uvicorn's httptools protocol
(llhttp, a C parser: what uvicorn and vLLM's own server pick by default) with one timer, armed when a
connection opens and when a later request's first byte arrives, cancelled once a request's headers are
in, closing the connection when it fires first; a request's line and headers over `MAX_HEADER_BYTES`
get a 400 and a close, as with h11. (It was h11's protocol, pure Python on every request and every
event a stream writes.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from liveloop.config import Config
from liveloop.server.config import ServerConfig
from liveloop.server.edge.admin import alarms, api_docs, dashboard, episodes, fleet, keys, learning, release
from liveloop.server.edge.admin import versions as admin_versions
from liveloop.server.edge.auth import Sessions
from liveloop.server.edge.body import BodyDeadline, BodyLimit
from liveloop.server.edge.chat import routes as chat
from liveloop.server.edge.chat import stored
from liveloop.server.edge.completions import routes as completions
from liveloop.server.edge.dependencies import EdgeState
from liveloop.server.edge.errors import install_handlers
from liveloop.server.edge.feedback import routes as feedback
from liveloop.server.edge.hosts import HostAllowList, allowed_hosts
from liveloop.server.edge.messages import routes as messages
from liveloop.server.edge.models import routes as models
from liveloop.server.edge.ops import routes as ops
from liveloop.server.edge.pipeline.streaming import Generating
from liveloop.server.edge.responses import routes as responses
from liveloop.server.edge.tokens import routes as tokens
from liveloop.server.edge.versions import routes as versions

MAX_HEADER_BYTES = 16 * 1024  # a request's line and headers at most (h11's bound, kept with httptools)
ROUTERS = (
    models.router, chat.router, completions.router, stored.router, messages.router, messages.probe, responses.router, tokens.router,
    feedback.router, versions.router, ops.router, admin_versions.router, learning.router, keys.router, fleet.router,
    episodes.router, dashboard.router, release.router, alarms.router,
    api_docs.router,  # behind the admin key, not FastAPI's public defaults
)

class UnsafeBind(ValueError):
    """The server would listen beyond loopback with the public development keys."""


def is_loopback(host: str) -> bool:
    """An address of this machine alone: a loopback IP literal, or `localhost` (not a name that only starts
    like one: `127.example.com` resolves anywhere)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def check_bind(config: Config) -> None:
    host = config.server.host
    if is_loopback(host):
        return
    if (config.auth.dev_user_keys or config.auth.dev_admin_keys) and not config.server.allow_dev_keys_on_public_bind:
        raise UnsafeBind(
            f"server.host = {host!r} listens beyond loopback, but auth.dev_user_keys / auth.dev_admin_keys hold the "
            "shipped development keys, which anyone can read: remove them and pass keys in "
            f"{config.auth.user_keys_env} / {config.auth.admin_keys_env} (or auth.*_key_sha256), "
            "or listen on 127.0.0.1"
        )


def create_app(server: ServerConfig, lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]) -> FastAPI:
    """The routes, error handlers, body limits and Host allow-list, with the edge's own state; `lifespan`
    (the composition root's) starts the server's parts and attaches their handlers before the first request."""
    app = FastAPI(title="liveloop", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_handlers(app)
    app.state.edge = EdgeState(
        sessions=Sessions(),
        generating=Generating(),
        ops_open_on_loopback=server.ops_open_on_loopback,
    )
    app.state.handlers = None  # until the lifespan attaches them
    app.state.replica_id = None
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(BodyDeadline, seconds=server.body_timeout_seconds)
    app.add_middleware(BodyLimit, max_bytes=server.max_body_bytes)
    app.add_middleware(ReplicaHeader, app_state=app.state)
    app.add_middleware(HostAllowList, entries=allowed_hosts(server))  # the outermost: nothing runs for a wrong Host
    return app


class ReplicaHeader:
    """Names the replica that answered in `x-liveloop-replica` (pure ASGI: streams pass untouched)."""

    def __init__(self, app: Any, app_state: Any):
        self.app, self.state = app, app_state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        replica = getattr(self.state, "replica_id", None)
        if scope["type"] != "http" or replica is None:
            await self.app(scope, receive, send)
            return
        header = (b"x-liveloop-replica", replica.encode())

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app(scope, receive, send_named)


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request headers are not complete within
    `header_timeout` seconds of its opening, or of the first byte of a later request on it. Between
    requests an idle connection is uvicorn's: `timeout_keep_alive` (`[server] keep_alive_seconds`) closes
    it. That idle limit sits well above the clients' own pool expiry (httpx's 5 s): a server that closes
    an idle connection at the instant a client reuses it drops that client's request (the client sees a
    read error, and a POST is not retried), so the client must always be the one to give up first."""

    header_timeout = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        """llhttp bounds no header's size (h11 held a request's head to 16 KiB): past MAX_HEADER_BYTES the
        parse fails, which uvicorn answers with a 400 and a close."""
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise ValueError(f"request line and headers over {MAX_HEADER_BYTES} bytes")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_message_begin(self) -> None:  # the parser met a request's first byte
        super().on_message_begin()
        self._header_bytes = 0
        if self._header_timer is None and not self.transport.is_closing():
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(server: ServerConfig) -> dict[str, Any]:
    """What `uvicorn.run` needs besides the app, host and port to bound slow clients."""
    protocol = type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": server.header_timeout_seconds})
    proxies = {"proxy_headers": bool(server.trusted_proxies), "forwarded_allow_ips": ",".join(server.trusted_proxies) or None}
    return {"http": protocol, "timeout_keep_alive": server.keep_alive_seconds, "log_level": server.log_level,
            "limit_concurrency": server.max_connections or None, **proxies}
