"""GET /v1/versions: the policy versions, for user keys (server/edge/versions/serving.py)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query

from liveloop.server.edge.auth import Principal, require_user
from liveloop.server.edge.dependencies import versions as handler
from liveloop.server.edge.versions.serving import ServingVersions

router = APIRouter(prefix="/v1")
VERSIONS_PAGE = 100  # versions per page when `limit` is not given
VERSIONS_PAGE_MAX = 1000


@router.get("/versions")
async def versions(
    _: Principal = Depends(require_user),
    h: ServingVersions = Depends(handler),
    limit: int = Query(VERSIONS_PAGE, ge=1, le=VERSIONS_PAGE_MAX, description="versions per page"),
    after: int | None = Query(None, ge=0, description="the page follows this version (the last one of the previous page)"),
    order: Literal["asc", "desc"] = Query("asc", description="by version: asc (oldest first) or desc"),
) -> dict:
    return await h.page(limit, after, order == "desc")
