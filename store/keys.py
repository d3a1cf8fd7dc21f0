"""The store's per-API-key queries: quarantine (a quarantined key's ratings stay stored but are never
trained or replayed, see `store.feedback.rated_after`), the keys' states for operators, the ratings the
disagreement score reads (monitor/poisoning.py), the ratings the monitor (drift, guard, reports)
reads without quarantined keys, and the bytes each key stored per UTC day (`add_stored_bytes`, in the
writer's inserting transaction; `stored_bytes`, what the edge's daily storage budget reads). The
store's `keys` part; every operator write here is one transaction, with its operator event."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

import liveloop.store.codec as codec
from liveloop.store.db import Part, dialect_insert
from liveloop.store.models import ApiKey, Feedback, KeyBytes, Response, aware, utcnow
from liveloop.store.lease import fenced
from liveloop.store.operator import add_event


DAY_SECONDS = 86400
ROW_OVERHEAD = 256  # a response row's ids, scalars and index entries, about


def utc_day(ts: datetime) -> int:
    """UTC days since 1970-01-01: the `key_bytes` row a moment counts in."""
    return int(aware(ts).timestamp() // DAY_SECONDS)


def row_bytes(row: dict[str, Any]) -> int:
    """What a `responses` row (store/feedback.py `response_row`) takes, about: its encoded token arrays
    and text as stored, its JSON as compact JSON, plus a fixed overhead."""
    size = ROW_OVERHEAD
    for value in row.values():
        if isinstance(value, bytes | str):
            size += len(value)
        elif isinstance(value, dict | list):
            size += len(json.dumps(value, separators=(",", ":"), default=str))
    return size


def add_stored_bytes(conn: Connection, rows: Sequence[dict[str, Any]], extra: Sequence[tuple[str, datetime, int]] = ()) -> None:
    """Count inserted `responses` rows (stamped: each has its created_at) against their keys' days,
    in the inserting transaction, and `extra` (key, when, bytes) stored beside them (a new grammar)."""
    added: Counter[tuple[str, int]] = Counter()
    for row in rows:
        added[(row["api_key_id"], utc_day(row["created_at"]))] += row_bytes(row)
    for key, at, n in extra:
        added[(key, utc_day(at))] += n
    if not added:
        return
    insert = dialect_insert(conn.dialect.name, KeyBytes)
    upsert = insert.on_conflict_do_update(index_elements=["api_key_id", "day"], set_={"bytes": KeyBytes.bytes + insert.excluded.bytes})
    conn.execute(upsert, [{"api_key_id": key, "day": day, "bytes": n} for (key, day), n in sorted(added.items())])


@dataclass(frozen=True)
class KeyState:
    """One API key (by its 16-hex digest) as operators see it."""

    key_id: str
    quarantined: bool
    reason: str | None
    ratings: int  # ratings stored from this key (quarantined ones included)
    forgotten_at: datetime | None
    updated_at: datetime | None  # when an operator (or the monitor) last changed it; None: never


@dataclass(frozen=True)
class KeyRating:
    """One rating as the disagreement score sees it: whose, of what, which way.

    `group` names the exact thing rated: a digest of the prompt's and the response's exact token ids, so
    two ratings share it only when the same reply to the same prompt was served to both. `prompt` (a
    digest of the prompt's token ids) and `tokens` (the response's token ids) let the score group
    similar replies to the same prompt (monitor/poisoning.py, `reply_groups`)."""

    feedback_id: int
    key_id: str
    group: str
    reward: int
    prompt: str = ""
    tokens: tuple[int, ...] = ()


def content_group(prompt_ids: bytes, response_ids: bytes) -> str:
    """The group of a response, from its stored token blobs (see `KeyRating.group`)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(len(prompt_ids).to_bytes(8, "little"))
    h.update(prompt_ids)
    h.update(response_ids)
    return h.hexdigest()


def prompt_digest(prompt_ids: bytes) -> str:
    """The identity of a prompt, from its stored token blob (see `KeyRating.prompt`)."""
    return hashlib.blake2b(prompt_ids, digest_size=12).hexdigest()


class KeyQueries(Part):
    """The store's keys part: quarantine and each key's ratings and state."""

    # -- quarantine -------------------------------------------------------------------------------
    def set_quarantined(
        self, key_id: str, quarantined: bool, reason: str | None = None, api_key_id: str | None = None, term: int | None = None,
    ) -> bool:
        """Quarantine (or release) `key_id`; returns whether its state changed. A change is logged as
        an operator event ("quarantine" / "unquarantine", detail {key_id, reason}) in the same
        transaction; `api_key_id` is who did it (None: the monitor). `term`: the leader lease's term of
        the monitor's automatic quarantine: StaleLeader, and nothing written, once it no longer leads."""
        with (self._write_session if term is not None else self._session).begin() as s:
            if term is not None:
                fenced(s, term)
            row = s.get(ApiKey, key_id, with_for_update=True)
            if row is None:
                if not quarantined:
                    return False
                row = ApiKey(key_id=key_id, quarantined=False)
                s.add(row)
            if bool(row.quarantined) == quarantined:
                return False
            row.quarantined, row.reason, row.updated_at = quarantined, reason, utcnow()
            kind = "quarantine" if quarantined else "unquarantine"
            add_event(s, kind, None, {"key_id": key_id, "reason": reason}, api_key_id)
            return True

    def quarantined_keys(self) -> set[str]:
        with self._session() as s:
            return set(s.scalars(select(ApiKey.key_id).where(ApiKey.quarantined.is_(True))))

    def key_states(self) -> list[KeyState]:
        """Every key that has ratings or an operator decision, by key id."""
        with self._session() as s:
            counts = dict(s.execute(select(Feedback.api_key_id, func.count()).group_by(Feedback.api_key_id)).all())
            rows = {r.key_id: r for r in s.scalars(select(ApiKey))}
        out = []
        for key in sorted(set(counts) | set(rows)):
            r = rows.get(key)
            out.append(
                KeyState(
                    key_id=key,
                    quarantined=bool(r and r.quarantined),
                    reason=r.reason if r else None,
                    ratings=int(counts.get(key, 0)),
                    forgotten_at=aware(r.forgotten_at) if r and r.forgotten_at else None,
                    updated_at=aware(r.updated_at) if r and r.updated_at else None,
                )
            )
        return out

    # -- what the disagreement score reads ----------------------------------------------------------
    def key_ratings(self, limit: int = 20000) -> list[KeyRating]:
        """The newest `limit` ratings (all keys, quarantined ones included), oldest first, each with
        its key, content group and reward."""
        with self._session() as s:
            rows = s.execute(
                select(Feedback.id, Feedback.api_key_id, Feedback.reward, Response.prompt_ids, Response.response_ids)
                .join(Response, Response.id == Feedback.response_id)
                .order_by(Feedback.id.desc())
                .limit(limit)
            ).all()
        return [
            KeyRating(fid, key, content_group(bytes(p), bytes(r)), int(reward), prompt_digest(bytes(p)), tuple(codec.decode_ids(bytes(r)).tolist()))
            for fid, key, reward, p, r in reversed(rows)
        ]

    def stored_bytes(self, api_key_id: str, day: int) -> int:
        """The bytes of responses `api_key_id` stored on UTC day `day` (`utc_day`)."""
        with self._session() as s:
            return s.scalar(select(KeyBytes.bytes).where(KeyBytes.api_key_id == api_key_id, KeyBytes.day == day)) or 0
