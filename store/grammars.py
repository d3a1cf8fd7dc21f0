"""The constraints responses were sampled under, stored once per API key (`grammars`, migration 0017):
a request's `n` choices, and every turn of an agent that forces the same call, share one row, named by
its sha256 from `responses.grammar_digest`. Written in the inserting transaction (`store_new`), read
back with the responses (`texts`), and dropped with the last response of its key that uses it
(`drop_unused`, under the deletion's rights lock, so no writer adds a use at the same time)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from liveloop.store.models import Grammar, Response


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def store_new(conn: Connection, records: Sequence[Any], created: Sequence[datetime]) -> list[tuple[str, datetime, int]]:
    """Store the grammars of `records` (ResponseRecords about to be inserted) that their keys do not hold
    yet; (key, created_at, bytes) of each one stored, for the key's daily byte count."""
    wanted: dict[tuple[str, str], tuple[str, datetime]] = {}
    for rec, at in zip(records, created):
        if rec.grammar is not None:
            wanted.setdefault((rec.api_key_id, digest(rec.grammar)), (rec.grammar, at))
    if not wanted:
        return []
    held = set(conn.execute(select(Grammar.api_key_id, Grammar.digest).where(_pairs(wanted))).tuples())
    new = [(pair, text, at) for pair, (text, at) in wanted.items() if pair not in held]
    if new:
        insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(Grammar)
        conn.execute(insert.on_conflict_do_nothing(),
                     [{"api_key_id": key, "digest": d, "text": text} for (key, d), text, _ in new])
    return [(key, at, len(text)) for (key, _), text, at in new]


def texts(conn: Any, rows: Iterable[Any]) -> dict[tuple[str, str], str]:
    """(key, digest) -> text for the rows (anything with api_key_id and grammar_digest) that name one."""
    pairs = {(r.api_key_id, r.grammar_digest) for r in rows if r.grammar_digest is not None}
    if not pairs:
        return {}
    found = conn.execute(select(Grammar.api_key_id, Grammar.digest, Grammar.text).where(_pairs(pairs)))
    return {(key, d): text for key, d, text in found}


def drop_unused(conn: Any, keys: Iterable[str]) -> None:
    """Delete the grammars of `keys` that no response of theirs names any more."""
    keys = sorted(set(keys))
    if not keys:
        return
    used = exists().where(Response.api_key_id == Grammar.api_key_id, Response.grammar_digest == Grammar.digest)
    conn.execute(delete(Grammar).where(Grammar.api_key_id.in_(keys), ~used))


def _pairs(pairs: Iterable[tuple[str, str]]) -> Any:
    """WHERE (api_key_id, digest) is one of `pairs`: one IN per key (a batch holds few keys), each over
    that key's digests."""
    by_key: dict[str, list[str]] = {}
    for key, d in pairs:
        by_key.setdefault(key, []).append(d)
    return or_(*(and_(Grammar.api_key_id == key, Grammar.digest.in_(ds)) for key, ds in sorted(by_key.items())))
