"""The write side of episodes: each response the writer inserts is linked to the turn it continues, in
the inserting transaction (docs/design.md, "Episodes").

The turn a response continues (its parent), in this order:
  1. the one its request named (`previous_response_id`, the Responses API; the route checked the key);
  2. else the longest earlier turn of the same key whose prompt and sampled tokens its prompt starts
     with, exactly (store/linking.py: hashes propose, tokens decide; with an episode tag, only among that
     tag's turns); the latest such turn when several are equal;
  3. else, when its request names an episode (`metadata.episode_id`, or a client's session:
     server/edge/sessions.py), the key's latest turn with that tag; a turn whose prompt is that turn's
     again (a retry) is linked as that turn was, its sibling, never its continuation.
None of these: it is an episode's first turn. Another key's turns never link. A parent that already has
a continuation gets a second one: two episodes sharing the turns up to it (a branch), each read from its
own last turn back (store/episodes.py).

Cost: one indexed query for the whole batch's prefix hashes, (api_key_id, link_hash), one for its tags
when any, one primary-key read of the chosen parents' tokens; nothing when no prompt carries a stored
turn's hash. A parent earlier in the same batch is found in the batch itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import ARRAY, BigInteger, Connection, any_, bindparam, select

import liveloop.store.codec as codec
from liveloop.store.linking import sequence_hash
from liveloop.store.models import Response
from liveloop.store.records import ResponseRecord


@dataclass
class _Turn:
    """A possible parent: what choosing one and checking its tokens needs."""

    id: str
    api_key_id: str
    link_hash: int | None
    tag: str | None
    order: tuple  # larger: later (stored ones by created_at, this batch's after all of them)
    prompt: np.ndarray | None = None
    response: np.ndarray | None = None
    root_id: str | None = None
    turn: int = 0
    link: tuple[str | None, str | None, int | None] | None = None  # a stored turn's own (parent_id, linked_by, prefix_tokens), read with its tokens


def link_turns(conn: Connection, records: Sequence[ResponseRecord], rows: Sequence[dict[str, Any]]) -> None:
    """Fill each row's parent_id, root_id, turn, prefix_tokens and linked_by (`records` and `rows` in
    submission order, the rows `response_row`s about to be inserted)."""
    stored = _stored_candidates(conn, records)
    by_hash: dict[tuple[str, int], list[_Turn]] = {}
    for t in stored.values():
        if t.link_hash is not None:
            by_hash.setdefault((t.api_key_id, t.link_hash), []).append(t)
    batch: dict[str, _Turn] = {}
    picks: list[tuple[_Turn, str] | None] = []
    for k, rec in enumerate(records):
        picks.append(_choose(rec, stored, by_hash, batch))
        own = _Turn(rec.id, rec.api_key_id, None if rec.link is None else rec.link.own, rec.episode_tag, (1, k),
                    np.asarray(rec.prompt_ids, np.int64), np.asarray(rec.response_ids, np.int64))
        batch[rec.id] = own
        if own.link_hash is not None:
            by_hash.setdefault((rec.api_key_id, own.link_hash), []).append(own)
    _load_tokens(conn, [pick[0] for pick in picks if pick is not None and pick[0].prompt is None])
    row_of = {rec.id: row for rec, row in zip(records, rows)}
    for rec, row, pick in zip(records, rows, picks):  # in order: a parent in this batch has its place already
        if pick is None:  # a first turn (set again: a batch retried row by row reuses its rows)
            row.update(parent_id=None, root_id=rec.id, turn=0, prefix_tokens=None, linked_by=None)
            continue
        parent, how = pick
        if parent.order[0] == 1:
            root, turn = row_of[parent.id]["root_id"], row_of[parent.id]["turn"]
        else:
            root, turn = parent.root_id or parent.id, parent.turn
        if how == "episode_id" and np.array_equal(parent.prompt, np.asarray(rec.prompt_ids, np.int64)):
            _resent(rec, row, parent, row_of)
            continue
        row.update(parent_id=parent.id, root_id=root, turn=turn + 1, linked_by=how, prefix_tokens=carried(rec.prompt_ids, parent))


def _resent(rec: ResponseRecord, row: dict[str, Any], twin: _Turn, row_of: dict[str, dict[str, Any]]) -> None:
    """A tagged turn's prompt sent again (a client's retry): linked as that turn was, its sibling (one more
    branch at the same place), never its continuation, and a first turn again when it was one."""
    if twin.order[0] == 1:
        t = row_of[twin.id]
        parent, how, prefix, root, turn = t["parent_id"], t["linked_by"], t["prefix_tokens"], t["root_id"], t["turn"]
    else:
        (parent, how, prefix), root, turn = twin.link or (None, None, None), twin.root_id, twin.turn
    if parent is None:
        row.update(parent_id=None, root_id=rec.id, turn=0, prefix_tokens=None, linked_by=None)
    else:
        row.update(parent_id=parent, root_id=root, turn=turn, linked_by=how, prefix_tokens=prefix)


def carried(prompt_ids: Sequence[int], parent: _Turn) -> int | None:
    """How many of `prompt_ids`' first tokens are the parent's prompt and sampled tokens, exactly: all of
    them, or all but a final stop token (the parent's link hash left it out: the template wrote its own
    end marker there); None when the prompt does not start with them."""
    p, n = len(parent.prompt), len(parent.response)
    want = np.concatenate([parent.prompt, parent.response])
    head = np.asarray(prompt_ids[: p + n], np.int64)
    if len(head) == p + n and np.array_equal(head, want):
        return p + n
    if n and parent.link_hash is not None and len(head) >= p + n - 1 and np.array_equal(head[: p + n - 1], want[: p + n - 1]):
        if sequence_hash(want[: p + n - 1]) == parent.link_hash:
            return p + n - 1
    return None


def _choose(rec: ResponseRecord, stored: dict[str, _Turn], by_hash: dict, batch: dict[str, _Turn]) -> tuple[_Turn, str] | None:
    named = rec.previous_response_id
    if named:
        parent = batch.get(named) or stored.get(named)
        if parent is not None and parent.api_key_id == rec.api_key_id:
            return parent, "previous_response"
    for _, h in reversed(rec.link.candidates if rec.link is not None else ()):  # longest prefix first
        found = [t for t in by_hash.get((rec.api_key_id, h), ()) if rec.episode_tag is None or t.tag == rec.episode_tag]
        if found:
            return max(found, key=lambda t: t.order), "prefix"
    if rec.episode_tag:
        tagged = [t for t in (*stored.values(), *batch.values()) if t.api_key_id == rec.api_key_id and t.tag == rec.episode_tag]
        if tagged:
            return max(tagged, key=lambda t: t.order), "episode_id"
    return None


HASHES_PER_QUERY = 8192  # prefix hashes one SQLite query binds (its variable limit: 32,766 or more by build)
_LIGHT = (Response.id, Response.api_key_id, Response.link_hash, Response.episode_tag, Response.created_at)


def _stored_candidates(conn: Connection, records: Sequence[ResponseRecord]) -> dict[str, _Turn]:
    """The stored turns any record could continue: those its prompt's prefix hashes name, the ones
    named by id, and the latest of each episode tag (light rows: no tokens yet)."""
    keys = sorted({r.api_key_id for r in records})
    hashes = sorted({h for r in records if r.link is not None for _, h in r.link.candidates})
    out: dict[str, _Turn] = {}

    def add(rows: Any) -> None:
        for row in rows:
            out.setdefault(row.id, _Turn(row.id, row.api_key_id, row.link_hash, row.episode_tag, (0, row.created_at, row.id)))

    if hashes and conn.dialect.name == "postgresql":  # one array parameter, however many hashes
        match = Response.link_hash == any_(bindparam("hashes", hashes, type_=ARRAY(BigInteger)))
        add(conn.execute(select(*_LIGHT).where(Response.api_key_id.in_(keys), match)))
    for at in range(0, len(hashes) if conn.dialect.name != "postgresql" else 0, HASHES_PER_QUERY):
        # SQLite binds a variable per hash: a batch of long agent prompts (up to MAX_CANDIDATES hashes
        # each) would pass its limit (32,766 in most builds) and fail every write in the batch
        match = Response.link_hash.in_(hashes[at:at + HASHES_PER_QUERY])
        add(conn.execute(select(*_LIGHT).where(Response.api_key_id.in_(keys), match)))
    named = sorted({r.previous_response_id for r in records if r.previous_response_id})
    if named:
        add(conn.execute(select(*_LIGHT).where(Response.id.in_(named))))
    for key, tag in sorted({(r.api_key_id, r.episode_tag) for r in records if r.episode_tag}):
        add(conn.execute(
            select(*_LIGHT).where(Response.api_key_id == key, Response.episode_tag == tag)
            .order_by(Response.created_at.desc(), Response.id.desc()).limit(1)
        ))
    return out


def _load_tokens(conn: Connection, turns: list[_Turn]) -> None:
    """The chosen stored parents' tokens and places, one primary-key read."""
    if not turns:
        return
    wanted = {t.id: t for t in turns}
    cols = (Response.id, Response.prompt_ids, Response.response_ids, Response.root_id, Response.turn, Response.parent_id,
            Response.linked_by, Response.prefix_tokens)
    for row in conn.execute(select(*cols).where(Response.id.in_(sorted(wanted)))):
        t = wanted[row.id]
        t.prompt, t.response = codec.decode_ids(row.prompt_ids).astype(np.int64), codec.decode_ids(row.response_ids).astype(np.int64)
        t.root_id, t.turn = row.root_id or row.id, row.turn or 0
        t.link = (row.parent_id, row.linked_by, row.prefix_tokens)
