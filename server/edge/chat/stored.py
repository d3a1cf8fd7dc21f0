"""OpenAI's stored chat completions, for the key that made them: GET /v1/chat/completions (a page,
by creation time, filtered by `model` and `metadata[key]=value`), GET /v1/chat/completions/{id}, GET
/v1/chat/completions/{id}/messages (the conversation it was asked), DELETE /v1/chat/completions/{id}
(the one deletion rule: the response and its ratings, server/edge/ownership.py). liveloop stores
every response (`store: false` opts out), so every chat completion is readable here by its key."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.auth import Principal, user
from liveloop.server.edge.dependencies import stored_chats
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.ownership import Ownership
from liveloop.server.edge.pages import list_page, page_in
from liveloop.store import StoredConversation
from liveloop.store.conversations import ConversationQueries

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


class StoredChats:
    """A key's stored chat completions: its pages, one completion, its messages, its deletion."""

    def __init__(self, conversations: ConversationQueries, ownership: Ownership):
        self.conversations = conversations
        self.ownership = ownership

    async def one(self, completion_id: str, principal: Principal) -> StoredConversation:
        return await self.ownership.owned(completion_id, principal, ENDPOINTS, "completion_id", "chat completion")

    async def page(self, principal: Principal, limit: int, after: str | None, descending: bool, model: str | None,
                   metadata: dict[str, str]) -> dict[str, Any]:
        self.ownership.count_read(principal)
        rows = await asyncio.to_thread(
            self.conversations.page, principal.key_id, ENDPOINTS, limit + 1, after, descending, model, metadata,
        )
        if rows is None:
            raise APIError(400, f"after: no chat completion `{after}` for this API key", param="after")
        return list_page([completion_body(c) for c in rows], limit)

    async def delete(self, completion_id: str, principal: Principal) -> dict[str, Any]:
        deleted = await self.ownership.delete(completion_id, principal, "completion_id")
        return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True, "ratings_deleted": deleted}


@router.get("/chat/completions")
async def list_completions(
    request: Request,
    principal: Principal = Depends(user),
    h: StoredChats = Depends(stored_chats),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: Literal["asc", "desc"] = Query("asc"),
    model: str | None = Query(None, max_length=128),
) -> dict:
    metadata = {k[len("metadata["):-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    if len(metadata) > MAX_FILTERS or any(not k or len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise APIError(400, f"metadata: at most {MAX_FILTERS} filters, keys 1-64 and values <= 512 characters", param="metadata")
    return await h.page(principal, limit, after, order == "desc", model, metadata)


@router.get("/chat/completions/{completion_id}")
async def retrieve(completion_id: str, principal: Principal = Depends(user), h: StoredChats = Depends(stored_chats)) -> dict:
    return completion_body(await h.one(completion_id, principal))


@router.get("/chat/completions/{completion_id}/messages")
async def messages(
    completion_id: str,
    principal: Principal = Depends(user),
    h: StoredChats = Depends(stored_chats),
    limit: int = Query(PAGE, ge=1, le=PAGE_MAX),
    after: str | None = Query(None, max_length=64),
    order: Literal["asc", "desc"] = Query("asc"),
) -> dict:
    found = await h.one(completion_id, principal)
    return page_in([{"id": f"{completion_id}-{i}", **m} for i, m in enumerate(found.messages)], limit, after, order, "message")


@router.delete("/chat/completions/{completion_id}")
async def delete(completion_id: str, principal: Principal = Depends(user), h: StoredChats = Depends(stored_chats)) -> dict:
    return await h.delete(completion_id, principal)
