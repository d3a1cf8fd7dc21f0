"""Operations: GET /healthz (each part's health + what is serving) and GET /metrics (Prometheus text),
read by server/edge/ops/serving.py.

Who may read what: /healthz's status (and its code) is public, for load balancers; its details (each
part's state, queue sizes, errors, the serving version) and /metrics need an admin key (a bearer key, or
the dashboard's session), or a client on loopback when `[server] ops_open_on_loopback` (off by
default: on one host every local user, and a proxy in front, is loopback). Without it /metrics answers
403 like the admin API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from liveloop.metrics import CONTENT_TYPE
from liveloop.server.edge.auth import is_admin, require_admin
from liveloop.server.edge.dependencies import edge, keyring
from liveloop.server.edge.dependencies import ops as handler
from liveloop.server.edge.ops.serving import Ops
from liveloop.server.edge.principal import KeyRing

LOOPBACK_CLIENTS = ("127.0.0.1", "::1")

router = APIRouter()


def _trusted(request: Request, keys: KeyRing) -> bool:
    """May this request read the operational details?"""
    if edge(request).ops_open_on_loopback and request.client is not None:
        host = request.client.host
        if host in LOOPBACK_CLIENTS or host.startswith("127.") or host == "::ffff:127.0.0.1":
            return True
    return is_admin(request, keys)


@router.get("/healthz")
async def healthz(request: Request, h: Ops = Depends(handler)) -> JSONResponse:
    status, code, details = await h.health()
    if not _trusted(request, keyring(request)):
        return JSONResponse({"status": status}, status_code=code)
    return JSONResponse(details, status_code=code)


@router.get("/metrics")
async def metrics(request: Request, h: Ops = Depends(handler)) -> Response:
    keys = keyring(request)
    if not _trusted(request, keys):
        require_admin(request, keys)  # raises the admin API's 401 / 403
    return Response(await h.metrics_text(), media_type=CONTENT_TYPE)

