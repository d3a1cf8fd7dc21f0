"""Reads of what chat-shaped responses were asked and answered (migration 0012), for the API: one
response for the key that received it (a stored chat completion, a Responses API response), the chain
of turns a Responses API turn continues (`previous_response_id`, one primary-key lookup a turn, newest
first, bounded), and a key's stored responses a page at a time with `model` and `metadata` filters
(on the (api_key_id, endpoint, created_at) index). `Store.conversations` is this, over the store's
sessions.

Only the key that received a response reads it: any other key (or an id that does not exist, was
deleted, or is being written still) reads nothing, the same answer either way, so ids do not leak."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, exists, func, or_, select

from liveloop.store.db import Part
from liveloop.store.models import Response, aware
from liveloop.store.records import StoredConversation

MAX_CHAIN = 1024  # turns a `previous_response_id` chain may have (a longer one is refused, not walked)

_COLUMNS = (
    Response.id, Response.api_key_id, Response.model, Response.endpoint, Response.policy_version, Response.created_at,
    Response.finish_reason, Response.prompt_tokens, Response.completion_tokens, Response.request_meta,
    Response.messages, Response.tools, Response.output, Response.options, Response.previous_response_id,
    Response.version_spans,
)


class ChainTooLong(ValueError):
    """A `previous_response_id` chain longer than MAX_CHAIN turns (or one that loops)."""


def _conversation(row: Any) -> StoredConversation:
    created = aware(row.created_at)
    spans = None if row.version_spans is None else tuple((a, b, v) for a, b, v in row.version_spans)
    return StoredConversation(
        row.id, row.api_key_id, row.model, row.endpoint, row.policy_version, created, row.finish_reason,
        row.prompt_tokens, row.completion_tokens, row.request_meta, row.messages or [], row.tools, row.output,
        row.options, row.previous_response_id, spans,
    )


def _tagged(dialect: str, key: str, value: str) -> Any:
    """The response's metadata holds `key` = `value`, for any key text: PostgreSQL's `->>`; SQLite's
    `json_each` (its JSON paths cannot name a key holding a double quote or a backslash)."""
    if dialect == "sqlite":
        each = func.json_each(Response.request_meta).table_valued("key", "value")
        return exists(select(1).select_from(each).where(each.c.key == key, each.c.value == value))
    return Response.request_meta[key].as_string() == value


class ConversationQueries(Part):

    def get(self, response_id: str, api_key_id: str, endpoints: tuple[str, ...]) -> StoredConversation | None:
        """The response `response_id` of one of `endpoints`, if this key received it."""
        with self._session() as s:
            row = s.execute(
                select(*_COLUMNS).where(Response.id == response_id, Response.api_key_id == api_key_id, Response.endpoint.in_(endpoints))
            ).first()
            return None if row is None or row.messages is None else _conversation(row)

    def chain(self, response_id: str, api_key_id: str, endpoints: tuple[str, ...]) -> list[StoredConversation] | None:
        """The turns up to and including `response_id`, oldest first, each the one its successor names
        as `previous_response_id`; None when `response_id` is not this key's. Raises ChainTooLong."""
        turns: list[StoredConversation] = []
        seen: set[str] = set()
        at: str | None = response_id
        with self._session() as s:
            while at is not None:
                if at in seen or len(turns) >= MAX_CHAIN:
                    raise ChainTooLong(f"the conversation before `{response_id}` is longer than {MAX_CHAIN} turns")
                seen.add(at)
                row = s.execute(
                    select(*_COLUMNS).where(Response.id == at, Response.api_key_id == api_key_id, Response.endpoint.in_(endpoints))
                ).first()
                if row is None or row.messages is None:
                    return None  # a turn of the chain was deleted (or is not this key's): the chain is gone
                turns.append(_conversation(row))
                at = row.previous_response_id
        return turns[::-1]

    def page(
        self,
        api_key_id: str,
        endpoints: tuple[str, ...],
        limit: int,
        after: str | None = None,
        descending: bool = False,
        model: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[StoredConversation] | None:
        """Up to `limit` of the key's responses of `endpoints` by creation time (then id), those after
        the response `after` (None when `after` is not one of them); only those of `model` and whose
        metadata holds every pair of `metadata`."""
        where = [Response.api_key_id == api_key_id, Response.endpoint.in_(endpoints), Response.messages.is_not(None)]
        if model is not None:
            where.append(Response.model == model)
        order = (Response.created_at.desc(), Response.id.desc()) if descending else (Response.created_at, Response.id)
        with self._session() as s:
            where += [_tagged(s.get_bind().dialect.name, key, value) for key, value in (metadata or {}).items()]
            if after is not None:
                mark = s.execute(
                    select(Response.created_at, Response.id).where(Response.id == after, Response.api_key_id == api_key_id)
                ).first()
                if mark is None:
                    return None
                if descending:
                    where.append(or_(Response.created_at < mark.created_at, and_(Response.created_at == mark.created_at, Response.id < mark.id)))
                else:
                    where.append(or_(Response.created_at > mark.created_at, and_(Response.created_at == mark.created_at, Response.id > mark.id)))
            rows = s.execute(select(*_COLUMNS).where(*where).order_by(*order).limit(limit)).all()
            return [_conversation(r) for r in rows]
