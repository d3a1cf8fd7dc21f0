"""The constraints responses were sampled under, stored once per API key (`grammars`, migration 0017):
a request's `n` choices, and every turn of an agent that forces the same call, share one row, named by
its sha256 from `responses.grammar_digest`. Written in the inserting transaction (`store_new`), read
back joined to its responses in the same statement (`NAMED`: one moment, so no deletion falls between
the two), and dropped with the last response of its key that uses it (`drop_unused`, under the
deletion's rights lock, so no writer adds a use at the same time)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, select

from liveloop.store.db import dialect_insert
from liveloop.store.models import Grammar, Response


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def store_new(conn: Connection, records: Sequence[Any], created: Sequence[datetime]) -> list[tuple[str, datetime, int]]:
    """Store the grammars of `records` (ResponseRecords about to be inserted) that their keys do not hold
    yet; (key, created_at, bytes) of each one this call stored, for the key's daily byte count."""
    wanted: dict[tuple[str, str], tuple[str, datetime]] = {}
    for rec, at in zip(records, created):
        if rec.grammar is not None:
            wanted.setdefault((rec.api_key_id, digest(rec.grammar)), (rec.grammar, at))
    if not wanted:
        return []
    keys = sorted({key for key, _ in wanted})
    held = set(conn.execute(select(Grammar.api_key_id, Grammar.digest).where(
        Grammar.api_key_id.in_(keys), Grammar.digest.in_(sorted({d for _, d in wanted})))).tuples())
    new = sorted((pair, text, at) for pair, (text, at) in wanted.items() if pair not in held)  # one order: no deadlock
    if not new:
        return []
    # only the rows this insert wrote are counted: a writer beside it that stored the same grammar first (its
    # insert then waits for that one's commit, and does nothing) counts none of it
    written = set(conn.execute(
        dialect_insert(conn.dialect.name, Grammar).on_conflict_do_nothing().returning(Grammar.api_key_id, Grammar.digest),
        [{"api_key_id": key, "digest": d, "text": text} for (key, d), text, _ in new],
    ).tuples())
    return [(key, at, len(text)) for (key, d), text, at in new if (key, d) in written]


NAMED = and_(Grammar.api_key_id == Response.api_key_id, Grammar.digest == Response.grammar_digest)  # the join


def gone(row: Any, text: str | None) -> bool:
    """Whether a response row read with its grammar's text (`NAMED`, outer join) names a grammar that is
    not there (a database edited by hand, a partial restore): such a row reads as gone, never as a
    response sampled freely, which the learner would train without its grammar's masks."""
    return row.grammar_digest is not None and text is None


def drop_unused(conn: Any, keys: Iterable[str]) -> None:
    """Delete the grammars of `keys` that no response of theirs names any more."""
    keys = sorted(set(keys))
    if not keys:
        return
    conn.execute(delete(Grammar).where(Grammar.api_key_id.in_(keys), ~exists().where(NAMED)))
