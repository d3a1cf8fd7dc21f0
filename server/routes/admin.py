"""Admin API (admin keys, or the dashboard's session): versions with lineage and reward, hot-swapping a
checkpoint in (`POST /admin/weights`), learning pause/resume, rollback, the drift monitor's state,
server statistics, the operator event log and the learner's status."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.auth import Principal, require_admin
from liveloop.server.body import parse_body
from liveloop.server.schemas import PauseRequest, RollbackRequest, SwapRequest

router = APIRouter(prefix="/admin")


@router.get("/versions")
async def versions(request: Request, _: Principal = Depends(require_admin)) -> dict:
    """Every version with its parent, status, traffic, reward rate (Wilson interval) and the test
    against its parent."""
    rows = await request.app.state.operations.versions()
    return {"object": "list", "serving": request.app.state.engine.version, "data": rows}


@router.post("/weights")
async def swap_weights(request: Request, _: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, SwapRequest)
    published = await request.app.state.publisher.publish_dir(req.path, note=req.note)
    return {"object": "policy_version", **published}


@router.post("/learning/pause")
async def pause(request: Request, principal: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, PauseRequest, empty_ok=True)
    return await request.app.state.operations.set_paused(True, principal.key_id, req.reason)


@router.post("/learning/resume")
async def resume(request: Request, principal: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, PauseRequest, empty_ok=True)
    return await request.app.state.operations.set_paused(False, principal.key_id, req.reason)


@router.post("/rollback")
async def rollback(request: Request, principal: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, RollbackRequest)
    return await request.app.state.operations.rollback(req.version, principal.key_id, req.reason)


@router.get("/drift")
async def drift(
    request: Request, since: float | None = Query(None, description="unix seconds: buckets from then on"), _: Principal = Depends(require_admin)
) -> dict:
    """The detectors' state, alarms, per-segment rates and the reward series (time buckets)."""
    monitor = request.app.state.operations.monitor
    state, series = await asyncio.to_thread(lambda: (monitor.state(), monitor.series(since)))
    return {"object": "drift", "window_seconds": monitor.config.window_seconds, **state, "series": series}


@router.get("/stats")
async def stats(request: Request, _: Principal = Depends(require_admin)) -> dict:
    state = request.app.state
    counts = await asyncio.to_thread(state.store.counts)
    return {
        "object": "stats",
        "serving": state.engine.version,
        "engine": state.engine.name,
        "model": state.serving.model_name,
        "uptime_seconds": int(time.time()) - state.started_at,
        "learning_paused": await state.operations.paused(),
        "counts": counts,
        "rating_rate": counts["feedback"] / counts["responses"] if counts["responses"] else None,
        "learner": await _learner_status(request),
    }


@router.get("/events")
async def events(request: Request, limit: int = Query(200, ge=1, le=5000), _: Principal = Depends(require_admin)) -> dict:
    rows = await asyncio.to_thread(request.app.state.store.events, None, limit)
    return {
        "object": "list",
        "data": [
            {"id": e.id, "kind": e.kind, "version": e.version, "detail": e.detail, "api_key_id": e.api_key_id, "at": e.created_at.timestamp()}
            for e in rows
        ],
    }


@router.get("/learner")
async def learner_status(request: Request, _: Principal = Depends(require_admin)) -> dict:
    """The co-located learner's state: version, cursor, steps, idle fraction, last metrics."""
    return {"object": "learner", **await _learner_status(request)}


async def _learner_status(request: Request) -> dict:
    learner = request.app.state.learner
    if learner is None:
        return {"running": False}
    try:
        status = await asyncio.to_thread(learner.status)
    except Exception as exc:  # busy or gone: say so rather than fail the page
        return {"running": False, "error": str(exc)[:200]}
    return {"running": True, **status}
