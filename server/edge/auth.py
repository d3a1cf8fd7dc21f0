"""API keys: who may call `/v1` (user keys) and `/admin` (admin keys), as FastAPI dependencies
(`user`, `require_user`, `require_admin`); the keys themselves are server/edge/principal.py's.

A key an operator forgot (`store.rights.forget_key`) is refused with 403, or with `[auth] forgotten_keys =
"unstored"` served as `Principal.unstored` (nothing of it is stored: the routes do not log it, and the
store's writer drops whatever of it still arrives).

The dashboard signs in once with an admin key and then holds a session cookie (HttpOnly,
SameSite=Strict, random token kept in memory only); writes made with the cookie must also carry the
`X-Liveloop-Dashboard: 1` header, which a cross-site form cannot send.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace
from typing import Any

from fastapi import Depends, Request
from limits import RateLimitItemPerMinute, storage, strategies

from liveloop.server.edge.dependencies import edge, keyring
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.principal import KeyRing, Principal, key_digest, key_id  # noqa: F401 (handed on: who a key is)

log = logging.getLogger(__name__)


SESSION_COOKIE = "liveloop_session"
CSRF_HEADER = "x-liveloop-dashboard"


class Sessions:
    """Dashboard sign-ins: random tokens mapped to the admin who signed in, for `ttl_seconds`."""

    def __init__(self, ttl_seconds: float = 8 * 3600, max_sessions: int = 1000):
        self.ttl = ttl_seconds
        self.max_sessions = max_sessions
        self._tokens: dict[str, tuple[Principal, float]] = {}

    def create(self, principal: Principal) -> str:
        now = time.monotonic()
        self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
        if len(self._tokens) >= self.max_sessions:
            self._tokens.pop(min(self._tokens, key=lambda t: self._tokens[t][1]))
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (principal, now + self.ttl)
        return token

    def resolve(self, token: str) -> Principal | None:
        found = self._tokens.get(token)
        if found is None or found[1] <= time.monotonic():
            return None
        return found[0]

    def drop(self, token: str) -> None:
        self._tokens.pop(token, None)


class LoginThrottle:
    """Failed dashboard sign-ins, in a moving one-minute window per client address and for all clients
    together: past either limit, sign-in answers 429 with Retry-After until the window has room (a
    right key too, so guessing cannot go on by also trying the right one). Successful sign-ins cost
    nothing. The total bounds guessing from many addresses; it also locks every browser out for up to
    a minute under such an attack, while admin keys keep working on the API. Both count with `limiter`
    (the `limits` library's interface): a `FleetRateLimiter` (server/edge/fleet_limits.py) counts every
    replica's failures, so guesses spread over a fleet's replicas meet one limit; None: this process's
    memory alone."""

    def __init__(self, per_client: int, total: int, limiter: strategies.RateLimiter | None = None):
        self._limiter = limiter or strategies.MovingWindowRateLimiter(storage.MemoryStorage())
        self._per_client = RateLimitItemPerMinute(per_client)
        self._total = RateLimitItemPerMinute(total)

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again; None when it may now."""
        waits = [
            stats.reset_time - time.time()
            for item, ids in ((self._per_client, ("login", client)), (self._total, ("login", "*")))
            if not self._limiter.test(item, *ids) and (stats := self._limiter.get_window_stats(item, *ids))
        ]
        return max(1, int(max(waits)) + 1) if waits else None

    def failed(self, client: str) -> None:
        self._limiter.hit(self._per_client, "login", client)
        self._limiter.hit(self._total, "login", "*")


def _bearer(request: Request) -> str:
    """The request's key: `Authorization: Bearer <key>` (OpenAI's clients), else `x-api-key: <key>`
    (Anthropic's)."""
    header = request.headers.get("authorization")
    if header is None and (key := request.headers.get("x-api-key", "").strip()):
        return key
    scheme, _, key = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise APIError(401, "missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`", code="invalid_api_key")
    return key.strip()


def require_user(request: Request, keys: KeyRing = Depends(keyring)) -> Principal:
    principal = keys.resolve(_bearer(request))
    if principal is None:
        raise APIError(401, "incorrect API key provided", code="invalid_api_key")
    if principal.key_id in keys.forgotten:
        if keys.forgotten_policy == "refuse":
            raise APIError(403, "this API key was forgotten by the operator: it is not served any more", code="key_forgotten")
        return replace(principal, unstored=True)
    return principal


async def user(request: Request, keys: KeyRing = Depends(keyring)) -> Principal:
    """`require_user` on the event loop: FastAPI hands a plain `def` dependency to a worker thread,
    a thread hop per request for a hash and a dict lookup."""
    return require_user(request, keys)


def is_admin(request: Request, keys: KeyRing) -> bool:
    """Whether the request carries an admin key (bearer) or a dashboard session; never raises."""
    if session_principal(request) is not None:
        return True
    try:
        principal = keys.resolve(_bearer(request))
    except APIError:  # no bearer key
        return False
    return principal is not None and principal.admin


def session_principal(request: Request) -> Principal | None:
    """The admin signed in to the dashboard with this request's cookie, if any."""
    token = request.cookies.get(SESSION_COOKIE)
    return edge(request).sessions.resolve(token) if token else None


def require_admin(request: Request, keys: KeyRing = Depends(keyring)) -> Principal:
    if "authorization" not in request.headers and "x-api-key" not in request.headers:
        principal = session_principal(request)
        if principal is not None:
            if request.method not in ("GET", "HEAD") and request.headers.get(CSRF_HEADER) != "1":
                raise APIError(403, f"dashboard writes need the `{CSRF_HEADER}: 1` header", code="insufficient_permissions")
            return principal
    principal = require_user(request, keys)
    if not principal.admin:
        raise APIError(403, "this route needs an admin key", code="insufficient_permissions")
    return principal


FORGOTTEN_REFRESH_SECONDS = 1.0  # how often the edge re-reads the forgotten keys (another process may forget one)


async def watch_forgotten(forgotten: Any, interval: float = FORGOTTEN_REFRESH_SECONDS) -> None:
    """Re-read the forgotten keys the edge refuses (or serves unstored) every `interval` seconds (off the
    loop), until cancelled: another replica may forget a key."""
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(forgotten.refresh)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reading the forgotten keys")
