"""The Responses API's stored responses, for the key that got them: one response, its input items, and
its deletion (any endpoint's response id: the one rule of server/edge/ownership.py)."""

from __future__ import annotations

from typing import Any

from liveloop.server.edge.ownership import Ownership
from liveloop.server.edge.pages import page_in
from liveloop.server.edge.principal import Principal
from liveloop.server.edge.responses.serving import ENDPOINTS, input_items, stored_body


class StoredResponses:
    """GET /v1/responses/{id}, its input items, and DELETE /v1/responses/{id}."""

    def __init__(self, ownership: Ownership):
        self.ownership = ownership

    async def retrieve(self, response_id: str, principal: Principal) -> dict[str, Any]:
        found = await self.ownership.owned(response_id, principal, ENDPOINTS, "response_id", "response", code="response_not_found")
        return stored_body(found)

    async def input_items(self, response_id: str, principal: Principal, limit: int, after: str | None, order: str) -> dict[str, Any]:
        """This turn's own input (the turns before it are their own responses' input items)."""
        found = await self.ownership.owned(response_id, principal, ENDPOINTS, "response_id", "response", code="response_not_found")
        return page_in(input_items(found.messages, found.options), limit, after, order, "input item")

    async def delete(self, response_id: str, principal: Principal) -> dict[str, Any]:
        """Delete a response this key received (from any endpoint: chat, completions, messages, the
        Responses API), and its ratings: no later training or replay reads it."""
        ratings = await self.ownership.delete(response_id, principal, "response_id")
        return {"id": response_id, "object": "response.deleted", "deleted": True, "ratings_deleted": ratings}
