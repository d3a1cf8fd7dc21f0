"""Operations: GET /healthz (liveness + what is serving) and GET /metrics (Prometheus text)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from liveloop.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> dict:
    state = request.app.state
    return {
        "status": "ok",
        "model": state.serving.model_name,
        "engine": state.engine.name,
        "policy_version": state.engine.version,
    }


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = request.app.state
    m = state.metrics
    m.set("server/policy_version", state.engine.version)
    m.set("store/writer_batches", state.writer.batches)
    m.set("store/writer_rows", state.writer.rows)
    m.set("store/writer_commit_seconds", state.writer.commit_seconds)
    if state.learner is not None:
        try:
            status = await asyncio.to_thread(state.learner.status)
        except Exception:  # the learner is busy or gone: serve the other metrics anyway
            status = None
        if status:
            for key in ("version", "cursor", "step", "samples", "skipped_steps", "idle_fraction"):
                m.set(f"learner/{key}", float(status[key]))
            for key, value in status["metrics"].items():
                m.set(key, float(value))
    return Response(m.render(), media_type=CONTENT_TYPE)
