"""The Responses API: POST /v1/responses (server/edge/responses/serving.py), GET /v1/responses/{id}
and GET /v1/responses/{id}/input_items for the key that got the response, and DELETE
/v1/responses/{id}: the key that got a response (of any endpoint) deletes it with its ratings
(server/edge/responses/stored.py, the rule of server/edge/ownership.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.auth import Principal, require_user, user
from liveloop.server.edge.dependencies import responses, stored_responses
from liveloop.server.edge.responses.serving import ServingResponses
from liveloop.server.edge.responses.stored import StoredResponses

router = APIRouter(prefix="/v1")
PAGE = 20
PAGE_MAX = 100


@router.post("/responses")
async def create(request: Request, principal: Principal = Depends(user), h: ServingResponses = Depends(responses)):
    return await h.handle(request, principal)


@router.get("/responses/{response_id}")
async def retrieve(response_id: str, principal: Principal = Depends(user), h: StoredResponses = Depends(stored_responses)) -> dict:
    return await h.retrieve(response_id, principal)


@router.get("/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    principal: Principal = Depends(user),
    h: StoredResponses = Depends(stored_responses),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: str = Query("desc", pattern="^(asc|desc)$"),
) -> dict:
    """This turn's own input (the turns before it are their own responses' input items)."""
    return await h.input_items(response_id, principal, limit, after, order)


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, principal: Principal = Depends(require_user),
                          h: StoredResponses = Depends(stored_responses)) -> dict:
    """Delete a response this key received (from any endpoint: chat, completions, messages, the
    Responses API), and its ratings: no later training or replay reads it."""
    return await h.delete(response_id, principal)
