"""Admin API (admin keys only): GET /admin/versions, POST /admin/weights (hot-swap a checkpoint
directory into the live engine as a new policy version)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.auth import Principal, require_admin
from liveloop.server.body import parse_body
from liveloop.server.routes.feedback import versions as list_versions
from liveloop.server.schemas import SwapRequest

router = APIRouter(prefix="/admin")


@router.get("/versions")
async def versions(request: Request, principal: Principal = Depends(require_admin)) -> dict:
    return await list_versions(request, principal)


@router.post("/weights")
async def swap_weights(request: Request, _: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, SwapRequest)
    published = await request.app.state.publisher.publish_dir(req.path, note=req.note)
    return {"object": "policy_version", **published}
