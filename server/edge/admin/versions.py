"""The admin API on policy versions (admin keys, or the dashboard's session): versions with lineage and
reward (`GET /admin/versions`, the newest 200 by default, paged back by `before`; `?segment=` one
lineage: a segment's adapters, or `base`), each configured segment's serving adapter (`GET
/admin/adapters`), the version statuses, hot-swapping a checkpoint in
(`POST /admin/weights`: copied into managed storage and checked first), rollback (`segment`: that
lineage only; an unknown one is a 404, the activator's UnknownSegment) and pinning versions against
checkpoint retention.

Domain refusals (no such version, not servable, ...) propagate as domain exceptions and become HTTP
errors in server/edge/errors.py; typed results become the response models of server/edge/admin/protocol.py
in server/edge/admin/views.py."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from liveloop.monitor.versions import BASE, lineage
from liveloop.segments import SHARED, Lineage
from liveloop.server.control.activator import Activator
from liveloop.server.control.operations import Operations
from liveloop.server.edge.admin import views as admin_json
from liveloop.server.edge.admin.protocol import (
    AdaptersView, Imported, PinResult, RollbackRequest, RolledBack, StatusList, SwapRequest, VersionList,
)
from liveloop.server.edge.admin.views import settled_body
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.dependencies import admin_versions as handler
from liveloop.server.edge.errors import APIError
from liveloop.server.engines.base import Engine
from liveloop.store.versions import VersionQueries

router = APIRouter(prefix="/admin")
VERSIONS_PAGE, VERSIONS_PAGE_MAX = 200, 1000  # a long-lived deployment has thousands (a version per step)


def adapter_mode(segments: tuple[str, ...]) -> str:
    """`[segments] adapters` as the activator's segments show it (liveloop/segments.py `lanes`)."""
    if not segments:
        return "none"
    return "shared" if segments == (SHARED,) else "segment"


class AdminVersions:
    """What operators read and do to the policy versions."""

    def __init__(self, operations: Operations, activator: Activator, engine: Engine, versions: VersionQueries):
        self.operations = operations
        self.activator = activator
        self.engine = engine
        self.versions = versions

    async def listed(self, segment: str | None, limit: int = VERSIONS_PAGE, before: int | None = None) -> VersionList:
        """The newest `limit` versions (older than `before`, if given), oldest first; `has_more` when
        older ones are left."""
        async def read() -> VersionList:
            rows = await self.operations.versions()
            serving = self.engine.version
            lineage_of: dict[str, Any] = {}
            if segment is not None:
                rows = lineage(rows, segment)
                if segment != BASE:
                    if not rows:  # a configured segment may have no versions yet; any other name: 404
                        self.activator.lane(Lineage(segment))
                    lineage_of = {"segment": segment, "adapter": self.activator.serving_adapters().get(segment)}
            if before is not None:
                rows = [r for r in rows if r.version < before]
            page = rows[-limit:]
            return VersionList(
                serving=serving, **lineage_of, data=[admin_json.version(r) for r in page], has_more=len(rows) > len(page),
            )

        return settled_body(await self.activator.changes.read(read))

    async def adapters(self) -> AdaptersView:
        activator, operations = self.activator, self.operations
        if not activator.segments:
            return admin_json.adapters("none", self.engine.version, [])

        async def read() -> AdaptersView:
            rows = await operations.versions()
            serving = activator.serving_adapters()
            segments = []
            for name in activator.segments:
                adapter = serving.get(name)
                segments.append(
                    admin_json.SegmentState(
                        segment=name,
                        learner=activator.lane(Lineage(name)),
                        serving=adapter,
                        policy_version=self.engine.version if adapter is None else adapter,
                        paused=await operations.paused(Lineage(name)),
                        versions=lineage(rows, name),
                    )
                )
            return admin_json.adapters(adapter_mode(activator.segments), self.engine.version, segments)

        return settled_body(await activator.changes.read(read))

    async def swap(self, req: SwapRequest, principal: Principal) -> Imported:
        return admin_json.imported(await self.operations.publish_weights(req.path, req.note, principal.key_id))

    async def rollback(self, req: RollbackRequest, principal: Principal) -> RolledBack:
        lineage = None if req.segment is None else Lineage(req.segment)  # None: the version's own
        result = await self.operations.rollback(req.version, principal.key_id, req.reason, lineage, req.expect_serving)
        return admin_json.rollback(result)

    async def set_pinned(self, version: int, pinned: bool, principal: Principal) -> PinResult:
        if not 0 <= version < 2**31:
            raise APIError(400, "version: out of range", param="version")
        changed = await asyncio.to_thread(self.versions.set_pinned, version, pinned, principal.key_id)  # VersionNotFound: 404
        return PinResult(version=version, pinned=pinned, changed=changed)


@router.get("/versions")
async def versions(
    h: AdminVersions = Depends(handler),
    segment: str | None = Query(None, min_length=1, max_length=256, description=f"one lineage: a segment's adapters, or `{BASE}`"),
    limit: int = Query(VERSIONS_PAGE, ge=1, le=VERSIONS_PAGE_MAX, description="versions per page: the newest"),
    before: int | None = Query(None, ge=0, description="the page's versions are older than this one (the previous page's first)"),
    _: Principal = Depends(require_admin),
) -> VersionList:
    """The versions with their parent, lineage (`segment`), status, traffic, reward rate (Wilson
    interval) and the test against its parent, newest `limit` first paged back by `before` (listed
    oldest first; `has_more` when older ones are left); `segment` keeps one lineage."""
    return await h.listed(segment, limit, before)


@router.get("/adapters")
async def adapters(h: AdminVersions = Depends(handler), _: Principal = Depends(require_admin)) -> AdaptersView:
    """Each configured segment: the adapter version serving it (None: the base weights), its pause
    switch, its number of versions and its latest one's reward. Without adapters: no segments."""
    return await h.adapters()


@router.get("/statuses")
async def statuses(_: Principal = Depends(require_admin)) -> StatusList:
    """The version statuses: their names, meaning, and whether a version in one can be served again."""
    return admin_json.statuses()


@router.post("/weights")
async def swap_weights(request: Request, h: AdminVersions = Depends(handler), principal: Principal = Depends(require_admin)) -> Imported:
    """Serve the checkpoint in the directory `path` as the next version, from a checked copy in the
    learner's checkpoint_dir (server/control/weights_import.py): the operator's directory is read once, here."""
    return await h.swap(await parse_body(request, SwapRequest), principal)


@router.post("/rollback")
async def rollback(request: Request, h: AdminVersions = Depends(handler), principal: Principal = Depends(require_admin)) -> RolledBack:
    """Serve a stored version again. An adapter version moves its own segment only; `segment` with the
    serving base version serves that segment the base weights again. `expect_serving`: the version the
    operator saw serving; 409 serving_changed (nothing done) if another serves now."""
    return await h.rollback(await parse_body(request, RollbackRequest), principal)


@router.post("/versions/{version}/pin")
async def pin(version: int, principal: Principal = Depends(require_admin), h: AdminVersions = Depends(handler)) -> PinResult:
    return await h.set_pinned(version, True, principal)


@router.post("/versions/{version}/unpin")
async def unpin(version: int, principal: Principal = Depends(require_admin), h: AdminVersions = Depends(handler)) -> PinResult:
    return await h.set_pinned(version, False, principal)
