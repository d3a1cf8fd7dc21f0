"""Admin API (admin keys, or the dashboard's session): versions with lineage and reward, hot-swapping a
checkpoint in (`POST /admin/weights`: copied into managed storage and checked first), learning
pause/resume, rollback, the drift monitor's state, server statistics, the operator event log and the
learner's status; the fleet of replicas (`GET /admin/replicas`); pinning versions against checkpoint retention; API keys: their state and
disagreement score, quarantine (ratings kept, never trained or replayed) and forget (every response and
rating of the key deleted); the version statuses (what the dashboard knows of them); the learning view
(`GET /admin/learning`: per segment and version, reward, moving reward and the served rate of the
declared behaviours, monitor/learning.py).

Per-segment adapters (`[learner] adapters`): `GET /admin/versions?segment=` lists one lineage (a
segment's adapters, or `base`), `GET /admin/adapters` each configured segment's serving adapter, pause
switch and latest version; pause/resume and rollback take an optional `segment` (an unknown one is a
404, the activator's UnknownSegment).

Domain refusals (no such version, not servable, ...) propagate as domain exceptions and become HTTP
errors in server/edge/errors.py; typed results become JSON in `admin_json`."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.admin.views import settled_body
from liveloop.server.edge.dependencies import Parts, parts
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import APIError
from liveloop.segments import SHARED
from liveloop.monitor.learning import DEFAULT_WINDOW, MAX_REPLIES, MAX_WINDOW, read_segment
from liveloop.monitor.versions import BASE, lineage
from liveloop.server.edge.admin import views as admin_json
from liveloop.server.control.forgetting import ForgetResult
from liveloop.server.edge.admin.protocol import ForgetRequest, PauseRequest, QuarantineRequest, RollbackRequest, SwapRequest

router = APIRouter(prefix="/admin")


@router.get("/versions")
async def versions(
    p: Parts = Depends(parts),
    segment: str | None = Query(None, min_length=1, max_length=256, description=f"one lineage: a segment's adapters, or `{BASE}`"),
    _: Principal = Depends(require_admin),
) -> dict:
    """Every version with its parent, lineage (`segment`), status, traffic, reward rate (Wilson
    interval) and the test against its parent; `segment` keeps one lineage."""

    async def read() -> dict:
        rows = await p.operations.versions()
        body = {"object": "list", "serving": p.engine.version}
        if segment is not None:
            rows = lineage(rows, segment)
            if segment != BASE:
                if not rows:  # a configured segment may have no versions yet; any other name: 404
                    p.activator.lane(segment)
                body |= {"segment": segment, "adapter": p.activator.serving_adapters().get(segment)}
        return body | {"data": [admin_json.version(r) for r in rows]}

    return settled_body(await p.activator.changes.read(read))


def adapter_mode(segments: tuple[str, ...]) -> str:
    """`[learner] adapters` as the activator's segments show it (liveloop/segments.py `lanes`)."""
    if not segments:
        return "none"
    return "shared" if segments == (SHARED,) else "segment"


@router.get("/adapters")
async def adapters(p: Parts = Depends(parts), _: Principal = Depends(require_admin)) -> dict:
    """Each configured segment: the adapter version serving it (None: the base weights), its pause
    switch, its number of versions and its latest one's reward. Without adapters: no segments."""
    activator = p.activator
    if not activator.segments:
        return admin_json.adapters("none", p.engine.version, [])

    async def read() -> dict:
        rows = await p.operations.versions()
        serving = activator.serving_adapters()
        segments = []
        for name in activator.segments:
            adapter = serving.get(name)
            segments.append(
                admin_json.SegmentState(
                    segment=name,
                    learner=activator.lane(name),
                    serving=adapter,
                    policy_version=p.engine.version if adapter is None else adapter,
                    paused=await p.operations.paused(name),
                    versions=lineage(rows, name),
                )
            )
        return admin_json.adapters(adapter_mode(activator.segments), p.engine.version, segments)

    return settled_body(await activator.changes.read(read))


@router.get("/replicas")
async def replicas(p: Parts = Depends(parts), _: Principal = Depends(require_admin)) -> dict:
    """The fleet: every serving process registered in the store (store/replicas.py), with what it
    serves, its generations running and its health; a heartbeat older than `[server] down_after_seconds`
    is "down". `replica`: the one that answered."""
    rows = await asyncio.to_thread(p.registry.rows, p.down_after_seconds)
    return {"object": "list", "replica": p.replica_id, "data": [admin_json.replica(r) for r in rows]}


@router.get("/statuses")
async def statuses(_: Principal = Depends(require_admin)) -> dict:
    """The version statuses: their names, meaning, and whether a version in one can be served again."""
    return {"object": "list", "data": admin_json.statuses()}


@router.post("/weights")
async def swap_weights(request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    """Serve the checkpoint in the directory `path` as the next version, from a checked copy in the
    learner's checkpoint_dir (server/control/weights_import.py): the operator's directory is read once, here."""
    req = await parse_body(request, SwapRequest)
    return admin_json.imported(await p.operations.publish_weights(req.path, req.note, principal.key_id))


@router.post("/learning/pause")
async def pause(request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    """Pause the learner, or with `segment` that segment's lane only (it neither trains nor activates)."""
    req = await parse_body(request, PauseRequest, empty_ok=True)
    return admin_json.learning(await p.operations.set_paused(True, principal.key_id, req.reason, req.segment))


@router.post("/learning/resume")
async def resume(request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, PauseRequest, empty_ok=True)
    return admin_json.learning(await p.operations.set_paused(False, principal.key_id, req.reason, req.segment))


@router.post("/rollback")
async def rollback(request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    """Serve a stored version again. An adapter version moves its own segment only; `segment` with the
    serving base version serves that segment the base weights again. `expect_serving`: the version the
    operator saw serving; 409 serving_changed (nothing done) if another serves now."""
    req = await parse_body(request, RollbackRequest)
    ops = p.operations
    return admin_json.rollback(await ops.rollback(req.version, principal.key_id, req.reason, req.segment, req.expect_serving))


@router.get("/drift")
async def drift(
    p: Parts = Depends(parts), since: float | None = Query(None, description="unix seconds: buckets from then on"), _: Principal = Depends(require_admin)
) -> dict:
    """The detectors' state, alarms, per-segment rates and the reward series (time buckets)."""
    monitor = p.operations.monitor
    state, series = await asyncio.to_thread(lambda: (monitor.state(), monitor.series(since)))
    return {"object": "drift", "window_seconds": monitor.config.window_seconds, **state, "series": [admin_json.bucket(b) for b in series]}


@router.get("/learning")
async def learning(
    p: Parts = Depends(parts),
    segment: str | None = Query(None, min_length=1, max_length=256, description=f"one segment (`{BASE}`: responses without one)"),
    window: int = Query(DEFAULT_WINDOW, ge=1, le=MAX_WINDOW, description="ratings in the moving reward"),
    _: Principal = Depends(require_admin),
) -> dict:
    """Per segment (the configured adapter segments, and `base` where responses were recorded without
    one) and per version that served it: ratings, reward with its interval, the moving reward over the
    last `window` ratings and the served rate of each `[monitor] behaviours` rule, over the segment's
    newest responses (at most MAX_REPLIES). An unknown segment is a 404."""
    names: list[str | None]
    if segment is None:
        names = [None, *p.activator.segments]
    elif segment == BASE:
        names = [None]
    else:
        p.activator.lane(segment)  # UnknownSegment: 404
        names = [segment]
    behaviours = p.operations.config.behaviours
    confidence = p.operations.config.confidence

    def decode(ids: list[list[int]]) -> list[str]:
        return p.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def read() -> list:
        views = [read_segment(p.store, decode, name, behaviours, window, confidence, MAX_REPLIES) for name in names]
        # with adapters every new response has a segment: the base row only where older ones have none
        keep = [name is not None or segment == BASE or not p.activator.segments or v.responses for v, name in zip(views, names)]
        return [v for v, k in zip(views, keep) if k]

    views = await asyncio.to_thread(read)
    return {
        "object": "learning", "window": window, "max_responses": MAX_REPLIES, "behaviours": list(behaviours),
        "data": [admin_json.segment_learning(v) for v in views],
    }


@router.get("/stats")
async def stats(p: Parts = Depends(parts), _: Principal = Depends(require_admin)) -> dict:
    counts = await asyncio.to_thread(p.store.feedback.counts)
    await p.activator.changes.idle()  # "serving" below is read with no await between: settled
    return {
        "object": "stats",
        "serving": p.engine.version,
        "engine": p.engine.name,
        "model": p.serving.model_name,
        "uptime_seconds": int(time.time()) - p.started_at,
        "learning_paused": await p.operations.paused(),
        "counts": counts,
        "rating_rate": counts["feedback"] / counts["responses"] if counts["responses"] else None,
        "learner": await _learner_status(p),
    }


@router.get("/events")
async def events(p: Parts = Depends(parts), limit: int = Query(200, ge=1, le=5000), _: Principal = Depends(require_admin)) -> dict:
    rows = await asyncio.to_thread(p.store.operator.events, None, limit)
    return {
        "object": "list",
        "data": [
            {"id": e.id, "kind": e.kind, "version": e.version, "detail": e.detail, "api_key_id": e.api_key_id, "at": e.created_at.timestamp()}
            for e in rows
        ],
    }


@router.get("/learner")
async def learner_status(_: Principal = Depends(require_admin), p: Parts = Depends(parts)) -> dict:
    """The co-located learner's state: version, cursor, steps, idle fraction, last metrics, and its pace
    (`pace`: each lane's arrival and training rates, backlog, seconds per rating, the behind and
    refused-step alarms; server/control/learner_watch.py)."""
    return {"object": "learner", **await _learner_status(p)}


async def _learner_status(p: Parts) -> dict:
    learner = p.learner
    if learner is None:
        return {"running": False, "state": "off", "pace": None}
    pace = admin_json.learner_pace(p.operations.learner_pace())  # measured on the store too while the learner is down
    health = dataclasses.asdict(learner.health())
    if health["state"] != "running":
        return {"running": False, **health, "pace": pace}
    try:
        status = await asyncio.to_thread(learner.status)
    except Exception as exc:  # busy, or it died since: say so rather than fail the page
        return {"running": False, **health, "error": str(exc)[:200], "pace": pace}
    return {"running": True, **health, **status.as_dict(), "pace": pace}


# -- versions: pinning against checkpoint retention ---------------------------------------------------
@router.post("/versions/{version}/pin")
async def pin(version: int, principal: Principal = Depends(require_admin), p: Parts = Depends(parts)) -> dict:
    return await _set_pinned(p, version, True, principal)


@router.post("/versions/{version}/unpin")
async def unpin(version: int, principal: Principal = Depends(require_admin), p: Parts = Depends(parts)) -> dict:
    return await _set_pinned(p, version, False, principal)


async def _set_pinned(p: Parts, version: int, pinned: bool, principal: Principal) -> dict:
    if not 0 <= version < 2**31:
        raise APIError(400, "version: out of range", param="version")
    changed = await asyncio.to_thread(p.store.versions.set_pinned, version, pinned, principal.key_id)  # VersionNotFound: 404
    return {"object": "policy_version", "version": version, "pinned": pinned, "changed": changed}


# -- API keys -------------------------------------------------------------------------------------------
def _key_id(key_id: str) -> str:
    if len(key_id) != 16 or any(c not in "0123456789abcdef" for c in key_id):
        raise APIError(400, "key_id: the 16 lowercase hex digits the store records for a key", param="key_id")
    return key_id


@router.get("/keys")
async def keys(p: Parts = Depends(parts), _: Principal = Depends(require_admin)) -> dict:
    """Every key with ratings or an operator decision, with its disagreement score."""
    rows = await p.operations.keys()
    return {"object": "list", "data": [admin_json.key(r) for r in rows]}


@router.post("/keys/{key_id}/quarantine")
async def quarantine(key_id: str, request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    req = await parse_body(request, QuarantineRequest, empty_ok=True)
    changed = await asyncio.to_thread(p.store.keys.set_quarantined, _key_id(key_id), True, req.reason, principal.key_id)
    return {"object": "api_key", "key_id": key_id, "quarantined": True, "changed": changed}


@router.delete("/keys/{key_id}/quarantine")
async def lift_quarantine(key_id: str, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    changed = await asyncio.to_thread(p.store.keys.set_quarantined, _key_id(key_id), False, None, principal.key_id)
    return {"object": "api_key", "key_id": key_id, "quarantined": False, "changed": changed}


@router.post("/keys/{key_id}/forget")
async def forget(key_id: str, request: Request, p: Parts = Depends(parts), principal: Principal = Depends(require_admin)) -> dict:
    """Delete every response served to the key and every rating it gave: no later training or replay
    reads them. With `{"weights": true}` the weights forget too: each lineage the key trained is rolled
    back to before its first trained rating and the learner trains everyone else's later ratings again
    from there (server/control/forgetting.py); `"dry_run": true` only reports that plan. Without a body (or
    `weights` false) versions already trained on the key are not retrained."""
    req = await parse_body(request, ForgetRequest, empty_ok=True)
    key = _key_id(key_id)
    if not req.weights:
        deleted = await asyncio.to_thread(p.store.rights.forget_key, key, principal.key_id)
        return {"object": "api_key.forgotten", "key_id": key_id, "responses_deleted": deleted.responses, "ratings_deleted": deleted.ratings}
    result = await p.forgetting.forget(key, req.dry_run, principal.key_id)  # KeyNotFound: 404
    return _forget_json(result)


def _forget_json(result: ForgetResult) -> dict:
    plan = result.plan
    body = {
        "object": "api_key.forget_plan" if result.dry_run else "api_key.forgotten",
        "key_id": plan.key_id,
        "dry_run": result.dry_run,
        "responses": plan.responses,
        "ratings": plan.ratings,
        "replay": sum(p.replay for p in plan.affected),
        "estimate_seconds": plan.estimate_seconds,
        "lineages": [dataclasses.asdict(p) for p in plan.lineages],
    }
    if result.deleted is not None:
        body |= {"responses_deleted": result.deleted.responses, "ratings_deleted": result.deleted.ratings}
    if not result.dry_run:
        body["done"] = [dataclasses.asdict(d) for d in result.done]
    return body
