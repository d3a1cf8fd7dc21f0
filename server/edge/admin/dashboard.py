"""The operator dashboard: GET /dashboard (the page, or a sign-in form), POST /dashboard/login and
/logout (an admin key for a session cookie), GET /dashboard/static/<file> (the page's script, style and
the vendored uPlot charting library: the page needs no network beyond this server).

The page itself only calls the admin API (`/admin/...`) with its session cookie. Failed sign-ins are
throttled per client address and overall (`[server] login_failures_per_minute`, `..._total`; 429 with
Retry-After, `LoginThrottle`)."""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from liveloop.server.edge.auth import SESSION_COOKIE, LoginThrottle, Sessions, session_principal
from liveloop.server.edge.dependencies import dashboard as handler
from liveloop.server.edge.dependencies import edge
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.principal import KeyRing, Principal

router = APIRouter(prefix="/dashboard")

STATIC = Path(__file__).resolve().parent / "static"
_ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "uplot.min.js": "text/javascript",
    "uplot.min.css": "text/css",
}

_LOGIN = """<!doctype html><html><head><meta charset="utf-8"><title>liveloop: sign in</title>
<link rel="stylesheet" href="/dashboard/static/dashboard.css"></head>
<body class="login"><form method="post" action="/dashboard/login">
<h1>liveloop operator console</h1><p>{message}</p>
<label>Admin key <input type="password" name="key" id="key" autocomplete="off" autofocus></label>
<button type="submit" id="sign-in">Sign in</button></form></body></html>"""


def _login_page(message: str = "Sign in with an admin API key.", status: int = 200) -> HTMLResponse:
    return HTMLResponse(_LOGIN.format(message=html.escape(message)), status_code=status)


class Dashboard:
    """Sign-in to the dashboard: an admin key (bearer, or the sign-in form) for a session cookie."""

    def __init__(self, keys: KeyRing, throttle: LoginThrottle, sessions: Sessions):
        self.keys = keys
        self.throttle = throttle
        self.sessions = sessions

    def admin(self, request: Request) -> Principal | None:
        principal = session_principal(request)
        if principal is None and "authorization" in request.headers:
            key = request.headers["authorization"].partition(" ")[2].strip()
            principal = self.keys.resolve(key)
        return principal if principal is not None and principal.admin else None

    async def login(self, request: Request) -> Response:
        throttle = self.throttle
        client = request.client.host if request.client else "?"
        wait = throttle.retry_after(client)
        if wait is not None:
            raise APIError(429, f"too many failed sign-ins: try again in {wait} s", code="rate_limit_exceeded", retry_after=wait)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        key = (form.get("key") or [""])[0].strip()
        principal = self.keys.resolve(key) if key else None
        if principal is None or not principal.admin:
            throttle.failed(client)
            return _login_page("That is not an admin key.", status=401)
        token = self.sessions.create(principal)
        response = RedirectResponse("/dashboard", status_code=303)
        response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict", path="/", max_age=int(self.sessions.ttl))
        return response


@router.get("")
async def page(request: Request, h: Dashboard = Depends(handler)) -> Response:
    if h.admin(request) is None:
        return _login_page()
    return FileResponse(STATIC / "dashboard.html", media_type="text/html", headers={"Cache-Control": "no-store"})


@router.post("/login")
async def login(request: Request, h: Dashboard = Depends(handler)) -> Response:
    return await h.login(request)


@router.post("/logout")
async def logout(request: Request) -> Response:
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        edge(request).sessions.drop(token)
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/static/{name}")
async def asset(name: str) -> Response:
    if name not in _ASSETS:
        raise APIError(404, f"no dashboard asset {name!r}")
    return FileResponse(STATIC / name, media_type=_ASSETS[name], headers={"Cache-Control": "max-age=3600"})
