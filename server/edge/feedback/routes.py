"""POST /v1/feedback: a thumbs up/down for a response this API key received; DELETE
/v1/responses/{id}: the key that received a response deletes it with its ratings, even while it is
being generated (a tombstone keeps its row out when it lands, store/rights.py); GET /v1/versions: the
policy versions, a page at a time (OpenAI's list form: `limit`, `after`, `order`; `has_more`), each
with the live replicas serving it (`replicas`, from the replica registry).

The rule for ratings: one (response, key) pair is one training sample at most. A change of mind
replaces the stored rating in place; the learner trains the latest value if it has not reached that
rating yet, and never trains the pair again after (the change is still stored and counted by the
per-version reward figures)."""

from __future__ import annotations

import asyncio

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request

from liveloop.server.edge.auth import Principal, require_user
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.dependencies import Parts, parts
from liveloop.server.edge.errors import APIError
from liveloop.server.edge.feedback.protocol import FeedbackRequest
from liveloop.server.edge.response_ids import issued
from liveloop.server.edge.pipeline.serving import LogFailed
from liveloop.store import FeedbackRecord, ResponseNotFound
from liveloop.store.replicas import serving_by_version
from liveloop.store.writer import WriterSlow

router = APIRouter(prefix="/v1")
VERSIONS_PAGE = 100  # versions per page when `limit` is not given
VERSIONS_PAGE_MAX = 1000


@router.post("/feedback")
async def feedback(request: Request, principal: Principal = Depends(require_user), p: Parts = Depends(parts)) -> dict:
    p.serving.admission.check_rate("feedback", principal.key_id)
    req = await parse_body(request, FeedbackRequest)
    if principal.unstored:  # a forgotten key: nothing of it is stored (the writer would drop it too)
        raise APIError(404, f"no response `{req.response_id}` for this API key", param="response_id")
    record = FeedbackRecord(req.response_id, principal.key_id, int(req.reward), req.comment)
    try:
        stored = await p.writer.write(record)
    except WriterSlow as exc:  # the store is stalled: not acknowledged (it may still land; a retry revises it)
        raise LogFailed.too_slow(exc) from exc
    except ResponseNotFound:
        # Same answer whether the id does not exist or belongs to another key: ids do not leak.
        raise APIError(404, f"no response `{req.response_id}` for this API key", param="response_id") from None
    p.metrics.inc("server/feedback", reward=str(stored.reward))
    return {
        "id": stored.id,
        "object": "feedback",
        "response_id": stored.response_id,
        "reward": stored.reward,
        "comment": stored.comment,
        "created": int(stored.created_at.timestamp()),
        "revisions": stored.revisions,
    }


def check_response_id(response_id: str, param: str) -> None:
    """A response id as a path holds it: what the store's id column can (1 to 64 characters, no NUL)."""
    if not 0 < len(response_id) <= 64 or "\x00" in response_id:
        raise APIError(400, f"{param}: 1 to 64 characters, no NUL", param=param)


async def delete_owned(p: Parts, response_id: str, principal: Principal, param: str) -> int:
    """THE deletion rule, for every route that deletes a response (any endpoint's id): the key that
    received it deletes it with its ratings, also while it is still being generated (a tombstone keeps
    its row out); any other key, or an id that does not exist, gets the same 404. An id this server
    never issues (server/edge/response_ids.py) is a 404 before the store is touched: no tombstone, no
    deletion lock. Returns the ratings deleted."""
    p.serving.admission.check_rate("feedback", principal.key_id)
    check_response_id(response_id, param)
    if not issued(response_id):
        raise APIError(404, f"no response `{response_id}` for this API key", param=param)
    # looked at first: a generation that ends meanwhile lands after the tombstone, which drops it
    generating = p.edge.generating.owner(response_id) == principal.key_id
    deleted = await asyncio.to_thread(p.store.rights.delete_response, response_id, principal.key_id)
    if not deleted.responses and not generating:
        raise APIError(404, f"no response `{response_id}` for this API key", param=param)
    return deleted.ratings


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, principal: Principal = Depends(require_user), p: Parts = Depends(parts)) -> dict:
    """Delete a response this key received (from any endpoint: chat, completions, messages, the
    Responses API), and its ratings: no later training or replay reads it."""
    ratings = await delete_owned(p, response_id, principal, "response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True, "ratings_deleted": ratings}


@router.get("/versions")
async def versions(
    _: Principal = Depends(require_user),
    p: Parts = Depends(parts),
    limit: int = Query(VERSIONS_PAGE, ge=1, le=VERSIONS_PAGE_MAX, description="versions per page"),
    after: int | None = Query(None, ge=0, description="the page follows this version (the last one of the previous page)"),
    order: Literal["asc", "desc"] = Query("asc", description="by version: asc (oldest first) or desc"),
) -> dict:
    rows = await asyncio.to_thread(p.store.versions.versions_page, after, limit + 1, order == "desc")
    page = rows[:limit]
    fleet = serving_by_version(await asyncio.to_thread(p.registry.rows, p.down_after_seconds))
    return {
        "object": "list",
        "serving": p.engine.version,
        "data": [
            {
                "version": v.version,
                "parent": v.parent,
                "segment": v.segment,  # the adapter segment whose lineage it is; None: the base weights
                "created": int(v.created_at.timestamp()),
                "status": v.status,
                "learner_step": v.learner_step,
                "samples_used": v.samples_used,
                "metrics": v.metrics,
                "note": v.note,
                "replicas": fleet.get(v.version, []),  # the live replicas serving it (store/replicas.py)
            }
            for v in page
        ],
        "first_id": page[0].version if page else None,
        "last_id": page[-1].version if page else None,
        "has_more": len(rows) > limit,
    }
