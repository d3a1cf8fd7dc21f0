"""The release gate's admin API: `GET /admin/versions/{v}/evaluation` (a version's latest evaluation:
each check's value against the live version's and the base model's, its bounds, pass or fail) and `GET
/admin/evaluations` (the latest evaluation of each recent version, for the dashboard). Admin keys or the
dashboard's session."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.auth import Principal, require_admin
from liveloop.server.errors import APIError
from liveloop.store.records import EvaluationRecord

router = APIRouter(prefix="/admin")


# -- evaluations (the evaluation suite's results, release/evaluation.py) -----------------------------
def evaluation_json(e: EvaluationRecord) -> dict:
    return {
        "object": "evaluation", "version": e.version, "live_version": e.live_version, "passed": e.passed,
        "failed": [c["name"] for c in e.checks if not c.get("passed")], "checks": e.checks,
        "seconds": e.seconds, "engine_seconds": e.engine_seconds, "created": e.created_at.timestamp(),
    }


@router.get("/versions/{version}/evaluation")
async def evaluation(version: int, request: Request, _: Principal = Depends(require_admin)) -> dict:
    """The latest evaluation of `version`: each check's value, the live version's and the base model's,
    its bounds and whether it held. 404 version_not_found / evaluation_not_found."""
    if not 0 <= version < 2**31:
        raise APIError(400, "version: out of range", param="version")
    store = request.app.state.store
    record, found = await asyncio.to_thread(lambda: (store.evaluation(version), store.get_version(version)))
    if found is None:
        raise APIError(404, f"no policy version {version}", param="version", code="version_not_found")
    if record is None:
        raise APIError(404, f"version {version} has not been evaluated (yet: a candidate's evaluation runs in the background; "
                       "none runs with [release.evaluation] enabled = false)", param="version", code="evaluation_not_found")
    return evaluation_json(record)


@router.get("/evaluations")
async def evaluations(
    request: Request, limit: int = Query(50, ge=1, le=500, description="the newest versions to look at"), _: Principal = Depends(require_admin)
) -> dict:
    """The latest evaluation of each of the newest `limit` versions that has one (the dashboard's
    version table), newest version first."""
    store = request.app.state.store

    def read() -> dict:
        versions = [v.version for v in store.versions_page(None, limit, descending=True)]
        return store.evaluations(versions)

    found = await asyncio.to_thread(read)
    return {"object": "list", "data": [evaluation_json(found[v]) for v in sorted(found, reverse=True)]}
