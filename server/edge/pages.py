"""OpenAI's list object (`data`, `first_id`, `last_id`, `has_more`) over rows the routes already hold:
a page of a key's stored chat completions, and a page of one response's messages or input items."""

from __future__ import annotations

from typing import Any

from liveloop.server.edge.errors import APIError


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
