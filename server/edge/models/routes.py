"""GET /v1/models and GET /v1/models/{id}: the one model this server serves, with the policy version
serving now (server/edge/models/serving.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import models as handler
from liveloop.server.edge.models.serving import ServingModels

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(_: Principal = Depends(user), h: ServingModels = Depends(handler)) -> dict:
    return h.listed()


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, _: Principal = Depends(user), h: ServingModels = Depends(handler)) -> dict:
    return h.named(model_id)
