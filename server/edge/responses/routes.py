"""The Responses API: POST /v1/responses (server/edge/responses/serving.py), GET /v1/responses/{id} and
GET /v1/responses/{id}/input_items for the key that got the response. Its DELETE is
server/edge/feedback/routes.py's one rule for every response id: the key that got it deletes it with its
ratings."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.chat.stored import owned, page_in
from liveloop.server.edge.dependencies import Handlers, Parts, handlers, parts
from liveloop.server.edge.responses.serving import ENDPOINTS, input_items, stored_body
from liveloop.store import StoredConversation

router = APIRouter(prefix="/v1")
PAGE = 20
PAGE_MAX = 100


@router.post("/responses")
async def create(request: Request, principal: Principal = Depends(user), h: Handlers = Depends(handlers)):
    return await h.responses.handle(request, principal)


async def _stored(p: Parts, response_id: str, principal: Principal) -> StoredConversation:
    return await owned(p, response_id, principal, ENDPOINTS, "response_id", "response", code="response_not_found")


@router.get("/responses/{response_id}")
async def retrieve(response_id: str, principal: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    return stored_body(await _stored(p, response_id, principal))


@router.get("/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    principal: Principal = Depends(user),
    p: Parts = Depends(parts),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: str = Query("desc", pattern="^(asc|desc)$"),
) -> dict:
    """This turn's own input (the turns before it are their own responses' input items)."""
    items = input_items((await _stored(p, response_id, principal)).messages)
    return page_in(items, limit, after, order, "input item")
