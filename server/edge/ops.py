"""Operations: GET /healthz (each part's health + what is serving) and GET /metrics (Prometheus text).

/healthz answers only once the server has started, its warm-up generation included
(server/edge/pipeline/readiness.py: its details say how it went, `warm_up`). It answers 503 when serving
cannot log (the writer thread is gone, or the store refuses commits and does not answer a ping); a
learner that is down or restarting makes it "degraded" with 200: users are still served and logged,
and the learner's ratings wait in the store. A stalled store
(locked, slow) makes it "degraded" too while the writer's oldest waiting write is older than
`[store] writer_stall_seconds` (`writer.oldest_age_seconds` says how old).

/metrics also carries the fleet's per-replica gauges, read from the replica registry at each scrape
(`liveloop_fleet_replica_version{replica}`, `_adapter_version{replica,segment}`, `_in_flight`,
`_healthy`, `_up`, `_heartbeat_age_seconds`, and `liveloop_fleet_replicas_up`), so any replica's
scrape shows the whole fleet.

Who may read what: /healthz's status (and its code) is public, for load balancers; its details (each
part's state, queue sizes, errors, the serving version) and /metrics need an admin key (a bearer key, or
the dashboard's session), or a client on loopback when `[server] ops_open_on_loopback` (off by
default: on one host every local user, and a proxy in front, is loopback). Without it /metrics answers
403 like the admin API."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from liveloop.metrics import CONTENT_TYPE
from liveloop.server.edge.auth import is_admin, require_admin
from liveloop.server.edge.dependencies import Parts, edge, parts

LOOPBACK_CLIENTS = ("127.0.0.1", "::1")

router = APIRouter()


def _trusted(request: Request, p: Parts) -> bool:
    """May this request read the operational details?"""
    if edge(request).ops_open_on_loopback and request.client is not None:
        host = request.client.host
        if host in LOOPBACK_CLIENTS or host.startswith("127.") or host == "::ffff:127.0.0.1":
            return True
    return is_admin(request, p.keys)


@router.get("/healthz")
async def healthz(request: Request, state: Parts = Depends(parts)) -> JSONResponse:
    writer = state.writer.health()
    store_ok = writer.store_ok
    if not store_ok:  # the last commit failed: is the store back?
        try:
            await asyncio.wait_for(asyncio.to_thread(state.store.ping), timeout=3)
            store_ok = True
        except Exception:
            store_ok = False
    engine_ok = state.engine.healthy()
    learner = _learner_health(state.learner)
    can_log = writer.alive and store_ok
    status = "ok" if can_log and engine_ok and not writer.stalled and learner["state"] in ("running", "off") else "degraded"
    if not (can_log and engine_ok):
        status = "unavailable"
    code = 200 if status != "unavailable" else 503
    if not _trusted(request, state):
        return JSONResponse({"status": status}, status_code=code)
    body = {
        "status": status,
        "model": state.serving.model_name,
        "engine": {"name": state.engine.name, "ok": engine_ok, "policy_version": state.engine.version},
        "policy_version": state.engine.version,
        "writer": {
            "ok": writer.alive, "queued": writer.queued, "queue_max": writer.queue_max, "failed_commits": writer.failed_commits,
            "oldest_age_seconds": round(writer.oldest_age, 3), "stalled": writer.stalled,
        },
        "store": {"ok": store_ok, "last_error": None if store_ok else writer.last_error},
        "learner": learner,
        "warm_up": None if state.warm_up is None else state.warm_up.details(),
    }
    return JSONResponse(body, status_code=code)


async def _fleet_metrics(state: Parts) -> None:
    """Per-replica gauges from the replica registry: version, adapter versions, load, health, up."""
    try:
        rows = await asyncio.to_thread(state.registry.rows, state.down_after_seconds)
    except Exception:  # the store is down: /metrics still answers with what this process knows
        return
    m = state.metrics
    m.set("fleet/replicas_up", sum(r.up for r in rows))
    m.set_series("fleet/replica_up", [({"replica": r.replica_id}, float(r.up)) for r in rows])
    m.set_series("fleet/replica_healthy", [({"replica": r.replica_id}, float(r.state == "up")) for r in rows])
    m.set_series("fleet/replica_version", [({"replica": r.replica_id}, r.serving_version) for r in rows if r.serving_version is not None])
    m.set_series("fleet/replica_in_flight", [({"replica": r.replica_id}, r.in_flight) for r in rows])
    m.set_series("fleet/replica_heartbeat_age_seconds", [({"replica": r.replica_id}, r.age_seconds) for r in rows])
    m.set_series(
        "fleet/replica_adapter_version",
        [({"replica": r.replica_id, "segment": s}, v) for r in rows for s, v in r.adapter_versions.items() if v is not None],
    )


def _learner_health(learner) -> dict:
    if learner is None:
        return {"state": "off"}
    health = learner.health()
    return {"state": health.state, "restarts": health.restarts, "last_error": health.last_error}


@router.get("/metrics")
async def metrics(request: Request, state: Parts = Depends(parts)) -> Response:
    if not _trusted(request, state):
        require_admin(request, state.keys)  # raises the admin API's 401 / 403
    m = state.metrics
    m.set("server/policy_version", state.engine.version)
    m.set("store/writer_batches", state.writer.batches)
    m.set("store/writer_rows", state.writer.rows)
    m.set("store/writer_commit_seconds", state.writer.commit_seconds)
    m.set("store/writer_queued", state.writer.health().queued)
    m.set("server/generations_running", state.serving.admission.total)
    m.set("store/writer_rejected", state.writer.rejected)
    m.set("store/writer_failed_commits", state.writer.failed_commits)
    m.set("store/writer_timed_out", state.writer.timed_out)
    m.set("store/writer_oldest_age_seconds", state.writer.oldest_age())
    await _fleet_metrics(state)
    if state.learner is not None:
        try:
            status = await asyncio.to_thread(state.learner.status)
        except Exception:  # the learner is busy or gone: serve the other metrics anyway
            status = None
        if status is not None:  # any learner's totals; a plain learner's version, cursor and last metrics too
            one = status.single
            keys = ("version", "cursor") if one is not None else ()
            for key in (*keys, "step", "samples", "skipped_steps", "idle_fraction"):
                m.set(f"learner/{key}", float(getattr(status, key)))
            for key, value in (one.metrics if one is not None else {}).items():
                m.set(key, float(value))
            if one is None:  # lanes (the default's shared adapter, segments): each lane's own under lane/, by segment
                for lane in status.lanes:
                    m.set("lane/version", float(lane.version), segment=lane.segment)
                    for key, value in lane.metrics.items():  # lane/learner/step_kl{segment="shared"}, ...
                        m.set(f"lane/{key}", float(value), segment=lane.segment)
    return Response(m.render(), media_type=CONTENT_TYPE)
