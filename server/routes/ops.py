"""Operations: GET /healthz (liveness + what is serving) and GET /metrics (Prometheus text)."""

from __future__ import annotations

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
    return Response(m.render(), media_type=CONTENT_TYPE)
