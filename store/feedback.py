"""The store's served traffic: responses and the ratings users give, in and out. All writes of served
traffic go through `write_batch` (called by the group-commit `BatchWriter`): responses are inserted in
bulk, feedback is validated (the response exists and was served to the same API key) and replaces an
earlier rating by the same key, all in one transaction. An operation that is invalid fails alone; a
batch that hits an unexpected database error is retried one operation at a time so that one bad row
never loses the others. The reads: a response and its ratings, the learner's feed (`rated_after` past
its cursor, `get_cursor`), counts, the drift monitor's ratings in arrival order, and the trainable
ratings a learner's pace is measured on (`trainable_since`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, Connection, Integer, any_, bindparam, cast, func, or_, select, text, true, update

import liveloop.store.codec as codec
import liveloop.store.grammars as grammars
from liveloop.store.bulk import insert_rows
from liveloop.store.db import Part
from liveloop.store.episode_links import link_turns
from liveloop.store.keys import add_stored_bytes
from liveloop.store.models import ApiKey, Feedback, Grammar, LearnerCursor, PolicyVersion, Response, aware, utcnow
from liveloop.store.operator import _only_trusted
from liveloop.store.records import FeedbackRecord, RatingEvent, ResponseRecord, StoredFeedback, StoredResponse, stored_sampling
from liveloop.store.rights import Barred, barred, hold_rights


class ResponseNotFound(LookupError):
    """No response with this id was served to this API key."""


WriteOp = ResponseRecord | FeedbackRecord


RESPONSE_TABLE = Response.__table__
FEEDBACK_TABLE = Feedback.__table__
# a change of mind, for many ratings in one executemany (bind names must differ from column names)
_UPDATE_RATING = (
    update(FEEDBACK_TABLE)
    .where(FEEDBACK_TABLE.c.id == bindparam("b_id"))
    .values(reward=bindparam("b_reward"), comment=bindparam("b_comment"), updated_at=bindparam("b_now"), revisions=bindparam("b_revisions"))
)

# PostgreSQL: n rating ids, the last one returned, from the one-row counter (migration 0008). The row
# lock this takes is held until the transaction ends, so the next writer's ids are taken only after
# these rows are committed (or rolled back, and the ids with them): ids are commit order.
_TAKE_RATING_IDS = text("UPDATE feedback_counter SET last_id = last_id + :n WHERE id = 1 RETURNING last_id")


def _owners_and_ratings(ids_match):
    """Rated responses' owners, each with the owner's earlier rating of it (NULLs when none)."""
    return (
        select(Response.id.label("response_id"), Response.api_key_id, Feedback.id, Feedback.created_at, Feedback.revisions)
        .outerjoin(Feedback, (Feedback.response_id == Response.id) & (Feedback.api_key_id == Response.api_key_id))
        .where(ids_match)
    )


_OWNERS_AND_RATINGS = _owners_and_ratings(Response.id.in_(bindparam("ids", expanding=True)))
# PostgreSQL: `= ANY(array)`, one parameter however many ids (an expanded IN of a few hundred binds
# costs more to render and parse than the lookup itself)
_OWNERS_AND_RATINGS_PG = _owners_and_ratings(Response.id == any_(bindparam("ids", type_=ARRAY(Response.id.type))))


def response_row(rec: ResponseRecord, now: datetime | None = None) -> dict[str, Any]:
    """The `responses` row of a record, as a Core dict (token arrays encoded). `created_at` is the
    record's own, else `now`; None when both are, and then the write path stamps its commit time."""
    return {
        "id": rec.id,
        "api_key_id": rec.api_key_id,
        "model": rec.model,
        "policy_version": rec.policy_version,
        "endpoint": rec.endpoint,
        "prompt_ids": codec.encode_ids(rec.prompt_ids),
        "response_ids": codec.encode_ids(rec.response_ids),
        "behavior_logprobs": codec.encode_floats(rec.behavior_logprobs),
        "action_mask": None if rec.action_mask is None else codec.encode_mask(rec.action_mask),
        "finish_reason": rec.finish_reason,
        "temperature": rec.temperature,
        "top_p": rec.top_p,
        "seed": rec.seed,
        "prompt_tokens": len(rec.prompt_ids),
        "completion_tokens": len(rec.response_ids),
        "latency_ms": rec.latency_ms,
        "ttft_ms": rec.ttft_ms,
        "request_meta": rec.request_meta,
        "created_at": rec.created_at or now,
        "segment": rec.segment,
        "version_spans": None if rec.version_spans is None else [list(span) for span in rec.version_spans],
        "messages": rec.messages,
        "tools": rec.tools,
        "output": rec.output,
        "options": rec.options,
        "grammar": None,  # stored once in `grammars` (store/grammars.py), named by its digest
        "grammar_digest": None if rec.grammar is None else grammars.digest(rec.grammar),
        "sampling": None if rec.sampling is None else rec.sampling.to_json(),
        "previous_response_id": rec.previous_response_id,
        "group_id": rec.group_id,
        "choice_index": rec.choice_index,
        "link_hash": None if rec.link is None else rec.link.own,
        "text_hash": None if rec.link is None else rec.link.text,
        "episode_tag": rec.episode_tag,
        # the store links it in the inserting transaction (store/episodes.py `link_turns`)
        "parent_id": None, "root_id": rec.id, "turn": 0, "prefix_tokens": None, "linked_by": None,
    }


def _stamped(rec: ResponseRecord, row: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
    """`rec`'s row (the one prepared earlier, if any) with `now` as created_at when it has none."""
    if row is None:
        return response_row(rec, now)
    if row["created_at"] is None:
        row["created_at"] = now
    return row


def _insert_ratings(conn: Connection, rows: list[dict[str, Any]]) -> list[int]:
    """Insert new ratings; returns their ids in `rows` order, which is submission order.

    Feedback ids are commit order on both backends, whatever number of writers (server processes)
    share the store: a learner's cursor moves past an id only once every smaller id that will ever
    exist is committed, so it never skips a rating still on its way.

    SQLite: one plain executemany, then the ids from last_insert_rowid(). SQLite has one writer at a
    time: `feedback` is an AUTOINCREMENT table, so each row gets the next id, and the statement holds
    the database's write lock until this transaction ends, so no other row comes between (the batch's
    ids are the n consecutive ids ending at the last one) and no other transaction commits before this
    one with a larger id. (An INSERT ... RETURNING in parameter order would make SQLAlchemy send one
    statement per row there.) PostgreSQL: n ids taken from the one-row `feedback_counter` in one
    UPDATE ... RETURNING, then one COPY with the ids given (a batched INSERT ... RETURNING costs more
    in building and parsing its SQL than the insert itself). The counter's row lock is held to commit,
    so a second writer takes its ids only after this transaction has committed (PostgreSQL makes a
    transaction's rows visible before it releases its locks) or rolled back, its ids with it (READ
    COMMITTED re-reads the row it waited for): ids are handed out in commit order, and a failed write
    leaves no gap.
    A sequence would not do: two transactions draw 5 and 6, the one with 6 commits first, a cursor
    moves to 6, and 5 commits behind it, skipped for ever. The counter is taken last, just before the
    insert, so it is held only for the COPY and the commit."""
    if conn.dialect.name == "sqlite":
        insert_rows(conn, FEEDBACK_TABLE, rows)
        last = conn.exec_driver_sql("SELECT last_insert_rowid()").scalar_one()
        return list(range(last - len(rows) + 1, last + 1))
    last = conn.execute(_TAKE_RATING_IDS, {"n": len(rows)}).scalar_one()
    ids = list(range(last - len(rows) + 1, last + 1))
    insert_rows(conn, FEEDBACK_TABLE, [row | {"id": fid} for row, fid in zip(rows, ids)])
    return ids


def _feedback_row(op: FeedbackRecord, now: datetime) -> dict[str, Any]:
    return {"response_id": op.response_id, "api_key_id": op.api_key_id, "reward": op.reward, "comment": op.comment, "created_at": now}


def _stored_response(row: Response, grammar_text: str | None) -> StoredResponse:
    """A stored response from its row and the text of the grammar it names (joined: `grammars.NAMED`)."""
    response_ids = codec.decode_ids(row.response_ids)
    mask = codec.decode_mask(row.action_mask) if row.action_mask is not None else None
    return StoredResponse(
        id=row.id,
        api_key_id=row.api_key_id,
        model=row.model,
        policy_version=row.policy_version,
        endpoint=row.endpoint,
        prompt_ids=codec.decode_ids(row.prompt_ids),
        response_ids=response_ids,
        behavior_logprobs=codec.decode_floats(row.behavior_logprobs),
        action_mask=mask if mask is not None else codec.decode_mask(b"\x01" * len(response_ids)),
        finish_reason=row.finish_reason,
        temperature=row.temperature,
        top_p=row.top_p,
        seed=row.seed,
        latency_ms=row.latency_ms,
        ttft_ms=row.ttft_ms,
        request_meta=row.request_meta,
        created_at=aware(row.created_at),
        segment=row.segment,
        version_spans=None if row.version_spans is None else tuple((a, b, v) for a, b, v in row.version_spans),
        grammar=row.grammar if row.grammar_digest is None else grammar_text,
        sampling=stored_sampling(row.sampling, row.temperature, row.top_p),
        group_id=row.group_id,
        choice_index=row.choice_index or 0,
        parent_id=row.parent_id,
        root_id=row.root_id,
        turn=row.turn or 0,
        prefix_tokens=row.prefix_tokens,
    )


def _stored_feedback(row: Feedback) -> StoredFeedback:
    return StoredFeedback(
        row.id, row.response_id, row.api_key_id, row.reward, row.comment, aware(row.created_at), row.revisions or 0
    )


class FeedbackQueries(Part):
    # -- served traffic -----------------------------------------------------------------------
    def write_batch(self, ops: Sequence[WriteOp], rows: Sequence[dict[str, Any] | None] | None = None) -> list[Any]:
        """Apply a batch in one transaction; returns, per op, its result or the exception it raised.
        `rows`, if given, holds each response's `response_row` already built (None: build it here),
        so that callers can encode off the writer's critical path.
        If the batch fails, each op is retried alone so that one bad row (a value the database
        cannot hold, a constraint) fails only itself; if every op fails alone too, the database
        itself is failing and the error is raised.

        SQLAlchemy Core on one connection, no ORM unit of work: responses go in with one COPY
        (PostgreSQL) or one driver executemany (SQLite, see `bulk`), ratings with one lookup, one
        update and one insert, so a batch costs a few round trips and one commit whatever its size."""
        try:
            with self.db.writing.begin() as conn:
                return self.apply_batch(conn, ops, rows)
        except Exception:
            if len(ops) == 1:
                raise
        results: list[Any] = []
        for k, op in enumerate(ops):  # isolate the bad operation
            try:
                with self.db.writing.begin() as conn:
                    results.extend(self.apply_batch(conn, [op], None if rows is None else [rows[k]]))
            except Exception as exc:
                results.append(exc)
        if all(isinstance(r, Exception) and not isinstance(r, ResponseNotFound) for r in results):
            raise results[0]
        return results

    def apply_batch(self, conn: Connection, ops: Sequence[WriteOp], rows: Sequence[dict[str, Any] | None] | None) -> list[Any]:
        """One transaction's writes (`conn` began it with the write lock: `Database.writing`). What a deletion
        marked is dropped here, under the rights lock (store/rights.py): a response with a tombstone or
        of a forgotten key is not inserted (its result is its id, as if stored and deleted), and a rating
        by a forgotten key is refused like a rating of a response that does not exist."""
        results: list[Any] = [None] * len(ops)
        now = utcnow()
        hold_rights(conn, shared=True)
        marks = self._barred(conn, ops)
        responses = [i for i, op in enumerate(ops) if isinstance(op, ResponseRecord)]
        kept = [i for i in responses if not marks.response(ops[i].id, ops[i].api_key_id)]
        if kept:
            inserted = [_stamped(ops[i], None if rows is None else rows[i], now) for i in kept]
            link_turns(conn, [ops[i] for i in kept], inserted)
            grammar_bytes = grammars.store_new(conn, [ops[i] for i in kept], [row["created_at"] for row in inserted])
            self._insert_responses(conn, inserted)
            add_stored_bytes(conn, inserted, grammar_bytes)
        for i in responses:
            results[i] = ops[i].id
        ratings = []
        for i, op in enumerate(ops):
            if isinstance(op, FeedbackRecord):
                if op.api_key_id in marks.keys:
                    results[i] = ResponseNotFound(op.response_id)
                else:
                    ratings.append((i, op))
        if ratings:
            self._put_ratings(conn, ratings, results, now)
        return results

    @staticmethod
    def _barred(conn: Connection, ops: Sequence[WriteOp]) -> Barred:
        pairs = [(op.id, op.api_key_id) for op in ops if isinstance(op, ResponseRecord)]
        keys = {op.api_key_id for op in ops}
        return barred(conn, pairs, keys)

    def _insert_responses(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        insert_rows(conn, RESPONSE_TABLE, rows)

    def _put_ratings(self, conn: Connection, ratings: list[tuple[int, FeedbackRecord]], results: list[Any], now: datetime) -> None:
        """Set-based: one lookup (owners and earlier ratings), one update, one insert.
        A (response, key) pair has ONE row for ever: a change of mind updates it in place (same id,
        `revisions` + 1), so a learner past that id never trains the pair again, and one that has
        not reached it yet trains the latest value. The same pair twice in a batch: the last wins."""
        # one round trip: each rated response's owner and the owner's earlier rating of it, if any
        wanted = list({op.response_id for _, op in ratings})
        lookup = _OWNERS_AND_RATINGS_PG if conn.dialect.name == "postgresql" else _OWNERS_AND_RATINGS
        known = {row.response_id: row for row in conn.execute(lookup, {"ids": wanted})}
        by_pair: dict[tuple[str, str], list[tuple[int, FeedbackRecord]]] = {}
        for i, op in ratings:
            owner = known.get(op.response_id)
            if owner is None or owner.api_key_id != op.api_key_id:
                results[i] = ResponseNotFound(op.response_id)
            else:
                by_pair.setdefault((op.response_id, op.api_key_id), []).append((i, op))
        if not by_pair:
            return
        existing = {pair: known[pair[0]] for pair in by_pair if known[pair[0]].id is not None}
        fresh, changed = [], []
        for pair, ops in by_pair.items():
            last = ops[-1][1]
            row = existing.get(pair)
            if row is None:
                fresh.append((ops, _feedback_row(last, now) | {"revisions": len(ops) - 1}))
                continue
            revisions = (row.revisions or 0) + len(ops)
            changed.append({"b_id": row.id, "b_reward": last.reward, "b_comment": last.comment, "b_now": now, "b_revisions": revisions})
            stored = StoredFeedback(row.id, row.response_id, row.api_key_id, last.reward, last.comment, aware(row.created_at), revisions)
            for i, _ in ops:
                results[i] = stored
        if changed:
            conn.execute(_UPDATE_RATING, changed)
        if fresh:
            ids = _insert_ratings(conn, [row for _, row in fresh])
            for (ops, row), fid in zip(fresh, ids):
                stored = StoredFeedback(fid, row["response_id"], row["api_key_id"], row["reward"], row["comment"], now, row["revisions"])
                for i, _ in ops:
                    results[i] = stored

    def insert_responses(self, records: Sequence[ResponseRecord]) -> None:
        now = utcnow()
        with self.db.writing.begin() as conn:
            rows = [response_row(r, now) for r in records]
            hold_rights(conn, shared=True)  # no deletion drops a grammar these rows name before they commit
            link_turns(conn, records, rows)
            grammars.store_new(conn, records, [now] * len(records))
            self._insert_responses(conn, rows)

    def put_feedback(self, record: FeedbackRecord) -> StoredFeedback:
        (result,) = self.write_batch([record])
        if isinstance(result, Exception):
            raise result
        return result

    def get_response(self, response_id: str) -> StoredResponse | None:
        with self._session() as s:  # one statement: the row and its grammar's text as of the same moment
            found = s.execute(select(Response, Grammar.text).outerjoin(Grammar, grammars.NAMED).where(Response.id == response_id)).first()
            return None if found is None or grammars.gone(*found) else _stored_response(*found)

    def get_feedback(self, response_id: str) -> list[StoredFeedback]:
        with self._session() as s:
            rows = s.scalars(select(Feedback).where(Feedback.response_id == response_id).order_by(Feedback.id)).all()
            return [_stored_feedback(r) for r in rows]

    def rated_after(self, feedback_id: int, limit: int, segment: str | None = None) -> list[tuple[StoredFeedback, StoredResponse]]:
        """The next `limit` trainable ratings past `feedback_id`, in arrival order, with their
        responses (only responses `segment` served, if given). Ratings of quarantined keys are kept in
        the store but never returned here, so no training or replay reads them."""
        only = Response.segment == segment if segment is not None else true()
        with self._session() as s:
            rows = s.execute(
                select(Feedback, Response, Grammar.text)
                .join(Response, Response.id == Feedback.response_id)
                .outerjoin(Grammar, grammars.NAMED)
                .outerjoin(ApiKey, ApiKey.key_id == Feedback.api_key_id)
                .where(Feedback.id > feedback_id, only, or_(ApiKey.quarantined.is_(None), ApiKey.quarantined.is_(False)))
                .order_by(Feedback.id)
                .limit(limit)
            ).all()
            # a response deleted between its row's read and its grammar's is gone: not returned
            return [(_stored_feedback(f), _stored_response(r, text)) for f, r, text in rows if not grammars.gone(r, text)]

    def trainable_since(
        self, since: datetime, after_id: int, segment: str | None = None, limit: int = 50_000
    ) -> tuple[list[tuple[int, datetime]], bool]:
        """(id, arrival time) of the trainable ratings (as `rated_after` reads them: quarantined keys'
        left out; only `segment`'s responses, if given) that lie past `after_id` (a learner's cursor) or
        arrived at or after `since`, newest first: what a lane's pace is measured on. At most `limit`
        past `after_id`, the newest; returns the rows and whether that limit cut them."""
        def trainable(*where: Any):
            q = select(Feedback.id, Feedback.created_at).where(*where)
            if segment is not None:
                q = q.join(Response, Response.id == Feedback.response_id).where(Response.segment == segment)
            return _only_trusted(q, True)

        with self._session() as s:
            past = s.execute(trainable(Feedback.id > after_id).order_by(Feedback.id.desc()).limit(limit)).all()
            recent = s.execute(trainable(Feedback.id <= after_id, Feedback.created_at >= since).order_by(Feedback.id.desc())).all()
        rows = [(int(i), aware(at)) for i, at in [*past, *recent]]
        return rows, len(past) >= limit

    def counts(self) -> dict[str, int]:
        with self._session() as s:
            return {
                "responses": s.scalar(select(func.count()).select_from(Response)) or 0,
                "feedback": s.scalar(select(func.count()).select_from(Feedback)) or 0,
                "policy_versions": s.scalar(select(func.count()).select_from(PolicyVersion)) or 0,
            }

    def get_cursor(self, name: str) -> int:
        with self._session() as s:
            row = s.get(LearnerCursor, name)
            return row.last_feedback_id if row else 0

    # -- drift monitor reads --------------------------------------------------------------------
    def rating_events(
        self, after_id: int = 0, limit: int = 10000, since: datetime | None = None, trusted: bool = False
    ) -> list[RatingEvent]:
        """Ratings past `after_id` (and at or after `since`) in arrival order, with their version and tags;
        `trusted`: without the ratings of quarantined keys (what drift and its reports read)."""
        with self._session() as s:
            q = _only_trusted(
                select(Feedback.id, Feedback.created_at, Feedback.reward, Response.policy_version, Response.request_meta)
                .join(Response, Response.id == Feedback.response_id)
                .where(Feedback.id > after_id)
                .order_by(Feedback.id)
                .limit(limit),
                trusted,
            )
            if since is not None:
                q = q.where(Feedback.created_at >= since)
            return [RatingEvent(*row) for row in s.execute(q).all()]

    def last_rating_id(self, skip: int = 0) -> int:
        """The id `skip` ratings before the newest one (0 when there are not that many): where to
        start replaying the most recent `skip` ratings."""
        with self._session() as s:
            q = select(Feedback.id).order_by(Feedback.id.desc()).offset(skip).limit(1)
            return s.scalar(q) or 0

    def responses_per_bucket(self, since: datetime, width_seconds: float) -> dict[int, int]:
        """Responses served per time bucket since `since`: {bucket start (unix seconds): count}."""
        if self.dialect == "sqlite":
            epoch = cast(func.strftime("%s", Response.created_at), Integer)
        else:
            epoch = cast(func.extract("epoch", Response.created_at), Integer)
        width = max(1, int(width_seconds))
        bucket = (epoch // width) * width
        with self._session() as s:
            rows = s.execute(select(bucket, func.count()).where(Response.created_at >= since).group_by(bucket)).all()
            return {int(b): int(n) for b, n in rows}
