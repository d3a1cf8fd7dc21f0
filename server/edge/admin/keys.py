"""The admin API on API keys (admin keys, or the dashboard's session): their state and disagreement
score, quarantine (ratings kept, never trained or replayed) and forget (every response and rating of the
key deleted; with `weights` the lineages it trained rolled back and retrained without it)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from liveloop.server.control.forgetting import ForgetResult, Forgetting, as_json
from liveloop.server.control.operations import Operations
from liveloop.server.edge.admin.protocol import (
    ForgetPlanView, ForgetRequest, Forgotten, KeyList, KeyView, Quarantined, QuarantineRequest,
)
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.dependencies import admin_keys as handler
from liveloop.server.edge.errors import APIError
from liveloop.store.keys import KeyQueries
from liveloop.store.rights import RightsQueries

router = APIRouter(prefix="/admin")


def _key_id(key_id: str) -> str:
    if len(key_id) != 16 or any(c not in "0123456789abcdef" for c in key_id):
        raise APIError(400, "key_id: the 16 lowercase hex digits the store records for a key", param="key_id")
    return key_id


class AdminKeys:
    """What operators read and decide of API keys."""

    def __init__(self, operations: Operations, keys: KeyQueries, rights: RightsQueries, forgetting: Forgetting):
        self.operations = operations
        self.keys = keys
        self.rights = rights
        self.forgetting = forgetting  # the server's one: one forget at a time moves learner cursors

    async def listed(self) -> KeyList:
        return KeyList(data=[KeyView.of(r) for r in await self.operations.keys()])

    async def set_quarantined(self, key_id: str, quarantined: bool, reason: str | None, principal: Principal) -> Quarantined:
        changed = await asyncio.to_thread(self.keys.set_quarantined, _key_id(key_id), quarantined, reason, principal.key_id)
        return Quarantined(key_id=key_id, quarantined=quarantined, changed=changed)

    async def forget(self, key_id: str, req: ForgetRequest, principal: Principal) -> Forgotten | ForgetPlanView:
        """Without `weights`, what was deleted; with it, the plan (and what was done), whose keys follow the
        plan's own shape (`_forget_json`)."""
        key = _key_id(key_id)
        if not req.weights:
            deleted = await asyncio.to_thread(self.rights.forget_key, key, principal.key_id)
            return Forgotten(key_id=key_id, responses_deleted=deleted.responses, ratings_deleted=deleted.ratings)
        return _forget_json(await self.forgetting.forget(key, req.dry_run, principal.key_id))  # KeyNotFound: 404


def _forget_json(result: ForgetResult) -> ForgetPlanView:
    plan = result.plan
    deleted = {} if result.deleted is None else {"responses_deleted": result.deleted.responses, "ratings_deleted": result.deleted.ratings}
    return ForgetPlanView(
        object="api_key.forget_plan" if result.dry_run else "api_key.forgotten",
        key_id=plan.key_id,
        dry_run=result.dry_run,
        responses=plan.responses,
        ratings=plan.ratings,
        replay=sum(p.replay for p in plan.affected),
        estimate_seconds=plan.estimate_seconds,
        lineages=[as_json(p) for p in plan.lineages],
        **deleted,
        **({} if result.dry_run else {"done": [as_json(d) for d in result.done]}),
    )


@router.get("/keys")
async def keys(h: AdminKeys = Depends(handler), _: Principal = Depends(require_admin)) -> KeyList:
    """Every key with ratings or an operator decision, with its disagreement score."""
    return await h.listed()


@router.post("/keys/{key_id}/quarantine")
async def quarantine(key_id: str, request: Request, h: AdminKeys = Depends(handler),
                     principal: Principal = Depends(require_admin)) -> Quarantined:
    req = await parse_body(request, QuarantineRequest, empty_ok=True)
    return await h.set_quarantined(key_id, True, req.reason, principal)


@router.delete("/keys/{key_id}/quarantine")
async def lift_quarantine(key_id: str, h: AdminKeys = Depends(handler), principal: Principal = Depends(require_admin)) -> Quarantined:
    return await h.set_quarantined(key_id, False, None, principal)


@router.post("/keys/{key_id}/forget")
async def forget(key_id: str, request: Request, h: AdminKeys = Depends(handler), principal: Principal = Depends(require_admin)) -> Forgotten | ForgetPlanView:
    """Delete every response served to the key and every rating it gave: no later training or replay
    reads them. With `{"weights": true}` the weights forget too: each lineage the key trained is rolled
    back to before its first trained rating and the learner trains everyone else's later ratings again
    from there (server/control/forgetting.py); `"dry_run": true` only reports that plan. Without a body (or
    `weights` false) versions already trained on the key are not retrained."""
    return await h.forget(key_id, await parse_body(request, ForgetRequest, empty_ok=True), principal)
