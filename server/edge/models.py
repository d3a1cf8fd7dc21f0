"""GET /v1/models and GET /v1/models/{id}: the one model this server serves, with the policy version
serving now."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.errors import APIError

router = APIRouter(prefix="/v1")


def _model(request: Request) -> dict:
    serving = request.app.state.serving
    return {
        "id": serving.model_name,
        "object": "model",
        "created": request.app.state.started_at,
        "owned_by": "liveloop",
        "max_model_len": serving.max_model_len,
        "policy_version": serving.engine.version,
    }


@router.get("/models")
async def list_models(request: Request, _: Principal = Depends(user)) -> dict:
    return {"object": "list", "data": [_model(request)]}


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request, _: Principal = Depends(user)) -> dict:
    if model_id != request.app.state.serving.model_name:
        raise APIError(404, f"the model `{model_id}` does not exist", param="model", code="model_not_found")
    return _model(request)
