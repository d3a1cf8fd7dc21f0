"""OpenAI's stored chat completions, for the key that made them: GET /v1/chat/completions (a page,
by creation time, filtered by `model` and `metadata[key]=value`), GET /v1/chat/completions/{id}, GET
/v1/chat/completions/{id}/messages (the conversation it was asked), DELETE /v1/chat/completions/{id}
(the one deletion rule: the response and its ratings, server/edge/feedback/routes.py). liveloop stores
every response (`store: false` opts out), so every chat completion is readable here by its key."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import Parts, parts
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.feedback.routes import check_response_id, delete_owned
from liveloop.store import StoredConversation

router = APIRouter(prefix="/v1")
ENDPOINTS = ("chat",)
PAGE = 20
PAGE_MAX = 100
MAX_FILTERS = 16


def completion_body(c: StoredConversation) -> dict[str, Any]:
    message = dict(c.output or {"role": "assistant", "content": ""})
    finish = "tool_calls" if c.finish_reason == "stop" and message.get("tool_calls") else c.finish_reason
    return {
        "id": c.id,
        "object": "chat.completion",
        "created": int(c.created_at.timestamp()),
        "model": c.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                  "total_tokens": c.prompt_tokens + c.completion_tokens},
        "metadata": c.request_meta or {},
        "policy_version": c.policy_version,
    }


async def owned(p: Parts, response_id: str, principal: Principal, endpoints: tuple[str, ...], param: str,
                what: str, code: str | None = None) -> StoredConversation:
    """The stored conversation of a response of `endpoints` this key received (any other key, or no
    such response, gets the same 404)."""
    check_response_id(response_id, param)
    found = await asyncio.to_thread(p.store.conversations.get, response_id, principal.key_id, endpoints)
    if found is None:
        raise APIError(404, f"no {what} `{response_id}` for this API key", param=param, code=code)
    return found


async def _one(p: Parts, response_id: str, principal: Principal) -> StoredConversation:
    return await owned(p, response_id, principal, ENDPOINTS, "completion_id", "chat completion")


def list_page(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's list object of `rows` (one past `limit` read, to know there are more)."""
    page = rows[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(rows) > limit}


def page_in(rows: list[dict[str, Any]], limit: int, after: str | None, order: str, what: str) -> dict[str, Any]:
    """A page of one response's items held in memory (its messages, its input items): `order`, then
    those after the item `after` (a 400 naming it when it is not one of them)."""
    if order == "desc":
        rows = rows[::-1]
    if after is not None:
        ids = [r["id"] for r in rows]
        if after not in ids:
            raise APIError(400, f"after: no {what} `{after}` in this response", param="after")
        rows = rows[ids.index(after) + 1:]
    return list_page(rows, limit)


@router.get("/chat/completions")
async def list_completions(
    request: Request,
    principal: Principal = Depends(user),
    p: Parts = Depends(parts),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: Literal["asc", "desc"] = Query("asc"),
    model: str | None = Query(None, max_length=128),
) -> dict:
    metadata = {k[len("metadata["):-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    if len(metadata) > MAX_FILTERS or any(not k or len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise APIError(400, f"metadata: at most {MAX_FILTERS} filters, keys 1-64 and values <= 512 characters", param="metadata")
    rows = await asyncio.to_thread(
        p.store.conversations.page, principal.key_id, ENDPOINTS, limit + 1, after, order == "desc", model, metadata,
    )
    if rows is None:
        raise APIError(400, f"after: no chat completion `{after}` for this API key", param="after")
    return list_page([completion_body(c) for c in rows], limit)


@router.get("/chat/completions/{completion_id}")
async def retrieve(completion_id: str, principal: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    return completion_body(await _one(p, completion_id, principal))


@router.get("/chat/completions/{completion_id}/messages")
async def messages(
    completion_id: str,
    principal: Principal = Depends(user),
    p: Parts = Depends(parts),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: Literal["asc", "desc"] = Query("asc"),
) -> dict:
    found = await _one(p, completion_id, principal)
    return page_in([{"id": f"{completion_id}-{i}", **m} for i, m in enumerate(found.messages)], limit, after, order, "message")


@router.delete("/chat/completions/{completion_id}")
async def delete(completion_id: str, principal: Principal = Depends(user), p: Parts = Depends(parts)) -> dict:
    deleted = await delete_owned(p, completion_id, principal, "completion_id")
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True, "ratings_deleted": deleted}
