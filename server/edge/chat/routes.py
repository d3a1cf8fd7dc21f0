"""OpenAI-compatible generation: POST /v1/chat/completions, POST /v1/completions, GET /v1/models and
GET /v1/models/{id}.

The routes only dispatch: each endpoint's request model is in server/protocol_<endpoint>.py, its
bodies and its stream's lifetime in server/serving_<endpoint>.py over the shared
`streaming.EndpointServing` (admission, disconnects, logging before the last byte)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from liveloop.server.auth import Principal, require_user
from liveloop.server.errors import APIError
from liveloop.server.serving_chat import ServingChat
from liveloop.server.serving_completions import ServingCompletions
from liveloop.server.streaming import Generating  # noqa: F401 (app.py makes `app.state.generating` from here)

router = APIRouter(prefix="/v1")


async def user(request: Request) -> Principal:
    """`require_user` on the event loop: FastAPI hands a plain `def` dependency to a worker thread,
    a thread hop per request for a hash and a dict lookup."""
    return require_user(request)


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


@router.post("/chat/completions")
async def chat_completions(request: Request, principal: Principal = Depends(user)):
    return await ServingChat(request).handle(principal)


@router.post("/completions")
async def completions(request: Request, principal: Principal = Depends(user)):
    return await ServingCompletions(request).handle(principal)
