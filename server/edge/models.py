"""GET /v1/models and GET /v1/models/{id}: the one model this server serves, with the policy version
serving now."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import Parts, parts
from liveloop.server.edge.errors import APIError

router = APIRouter(prefix="/v1")


def _model(p: Parts) -> dict:
    serving = p.serving
    return {
        "id": serving.model_name,
        "object": "model",
        "created": p.started_at,
        "owned_by": "liveloop",
        "max_model_len": serving.max_model_len,
        "policy_version": serving.engine.version,
    }


@router.get("/models")
async def list_models(_: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    return {"object": "list", "data": [_model(p)]}


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, _: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    if model_id != p.serving.model_name:
        raise APIError(404, f"the model `{model_id}` does not exist", param="model", code="model_not_found")
    return _model(p)
