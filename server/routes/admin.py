"""Admin API (admin keys only): GET /admin/versions, POST /admin/weights (hot-swap a checkpoint
directory into the live engine as a new policy version), GET /admin/learner."""

from __future__ import annotations

import asyncio

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


@router.get("/learner")
async def learner_status(request: Request, _: Principal = Depends(require_admin)) -> dict:
    """The co-located learner's state: version, cursor, steps, idle fraction, last metrics."""
    learner = request.app.state.learner
    if learner is None:
        return {"object": "learner", "running": False}
    status = await asyncio.to_thread(learner.status)
    return {"object": "learner", "running": True, **status}
