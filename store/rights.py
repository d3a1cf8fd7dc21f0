"""The store's data-rights queries: a user deletes one of its responses, an operator forgets a key,
retention deletes what is older than `[store] retain_days`. The store's `rights` part.

Deleting a response (or retention's deleting it) deletes the later turns of its episodes too, whose
prompts carry its text (store/episodes.py: an episode goes from the deleted turn on; the turns before
it stay, and train as the shorter trajectory they were), and its ratings in the same transaction, so
no later training run, replay, report or critic pre-training reads them. Versions already trained on
them stay as they are.

A deletion also holds for what is not logged yet. A response is written by the group-commit writer
after (or while) it is generated, so a delete or a forget may come first: each leaves a mark the writer
reads in its inserting transaction (`barred`): a tombstone per deleted response id and key
(`deleted_responses`; the id may not be logged yet), and `api_keys.forgotten_at` per forgotten key,
whose responses and ratings the writer drops from then on. The two sides are serialised: on SQLite
both take the write lock when they begin (`BEGIN IMMEDIATE`); on PostgreSQL the writer holds a shared
transaction-scoped advisory lock and a deletion an exclusive one, so either the deletion sees the
committed row, or the writer sees the mark.

Deleted text must not stay on disk: SQLite runs with `secure_delete` (store/db.py), and each deletion
ends with a WAL checkpoint that truncates the `-wal` file (else it keeps the rows' old pages until they
are reused); PostgreSQL's autovacuum reclaims dead tuples. Forget that reaches the weights (server/control/forgetting.py) plans from here: `key_first_rating`,
`replay_count` and `rewind_lineage` (a learner's cursor moved back in one version-state transaction, so
it trains those ratings again). `forgotten`: the edge's view of the forgotten keys (`ForgottenKeys`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, exists, func, or_, select, text, true
from sqlalchemy.orm import Session

from liveloop.store.db import Part, busy_timeout
from liveloop.store.episodes import descendants_cte
from liveloop.store.grammars import drop_unused
from liveloop.store.models import ApiKey, DeletedResponse, Feedback, Grammar, KeyBytes, LearnerCursor, Response, utcnow
from liveloop.store.lease import fenced
from liveloop.store.operator import add_event

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key between deletions (exclusive) and the writer's inserts (shared) ("llrt")
RIGHTS_LOCK = 0x6C6C7274
TOMBSTONE_DAYS = 1.0  # a tombstone outlives any response still on its way to the store (then pruned)
CHECKPOINT_BUSY_MS = 2000  # a checkpoint waits at most this long for readers (writers wait meanwhile), then leaves it to the next one


class KeyNotFound(LookupError):
    """The store knows nothing of this key: no response, rating or operator decision."""


@dataclass(frozen=True)
class Deleted:
    responses: int
    ratings: int


@dataclass(frozen=True)
class Barred:
    """What the writer must not store in this transaction: response ids by key, and forgotten keys."""

    responses: frozenset[tuple[str, str]]  # (response id, key id) pairs with a tombstone
    keys: frozenset[str]

    def response(self, response_id: str, key_id: str) -> bool:
        return key_id in self.keys or (response_id, key_id) in self.responses


NOTHING_BARRED = Barred(frozenset(), frozenset())


def barred(conn: Connection, responses: Sequence[tuple[str, str]], keys: set[str]) -> Barred:
    """Which of these (response id, key) pairs and keys a deletion has marked; called by the writer at
    the start of its inserting transaction (after `hold_rights(conn, shared=True)`)."""
    if not responses and not keys:
        return NOTHING_BARRED
    forgotten = set()
    if keys:
        forgotten = set(conn.execute(select(ApiKey.key_id).where(ApiKey.key_id.in_(sorted(keys)), ApiKey.forgotten_at.is_not(None))).scalars())
    dead: set[tuple[str, str]] = set()
    if responses:
        ids = sorted({rid for rid, _ in responses})
        table = DeletedResponse.__table__
        dead = {(r, k) for r, k in conn.execute(select(table.c.response_id, table.c.api_key_id).where(table.c.response_id.in_(ids)))}
    return Barred(frozenset(dead), frozenset(forgotten)) if dead or forgotten else NOTHING_BARRED


def hold_rights(conn: Connection, shared: bool) -> None:
    """PostgreSQL: the rights lock for the rest of this transaction (shared: the writer's inserts;
    exclusive: a deletion). SQLite: nothing (both sides begin IMMEDIATE)."""
    if conn.dialect.name == "postgresql":
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        conn.execute(text(f"SELECT {fn}(:key)"), {"key": RIGHTS_LOCK})


class ForgottenKeys:
    """The forgotten keys as the edge sees them (what `[auth] forgotten_keys` does with their later
    requests): `refresh()` reads them from the store (call it off the event loop, every few seconds);
    `add` marks one at once (this process forgot it); `in` reads the set, never the store. The writer's
    check in its transaction is what guarantees nothing of theirs is stored; the set only decides what
    the key is told."""

    def __init__(self, read: Callable[[], Iterable[str]]):
        self._read = read
        self._keys: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        keys = frozenset(self._read())
        with self._lock:
            self._keys = self._keys | keys

    def add(self, key_id: str) -> None:
        with self._lock:
            self._keys = self._keys | {key_id}

    def __contains__(self, key_id: str) -> bool:
        return key_id in self._keys


class RightsQueries(Part):
    """The store's rights part: deletion, forgetting, retention and the replays they cause."""

    @functools.cached_property
    def forgotten(self) -> ForgottenKeys:
        return ForgottenKeys(self.forgotten_keys)

    def forgotten_keys(self) -> set[str]:
        with self._session() as s:
            return set(s.scalars(select(ApiKey.key_id).where(ApiKey.forgotten_at.is_not(None))))

    @contextlib.contextmanager
    def _deleting(self, term: int | None = None) -> Iterator[Session]:
        """A deletion's transaction: the write lock from its start (SQLite), the rights lock (PostgreSQL);
        with `term`, a leader's (store/lease.py `fenced`)."""
        with self._write_session.begin() as s:
            if term is not None:
                fenced(s, term)
            hold_rights(s.connection(), shared=False)
            yield s

    def delete_response(self, response_id: str, api_key_id: str) -> Deleted:
        """Delete a response served to `api_key_id`, with its ratings, and leave a tombstone so that the
        response is not stored if it is still on its way (being generated, or queued for the writer).
        Deleted(0, 0) when no such response is stored for that key (the caller answers 404 unless it
        knows the response is being generated: ids do not leak). A tombstone matches only this key's
        response, and is left only for an id nothing is stored under: another key's stored response
        can never be this key's, so naming it writes nothing."""
        with self._deleting() as s:
            s.execute(delete(DeletedResponse).where(DeletedResponse.created_at < utcnow() - timedelta(days=TOMBSTONE_DAYS)))
            owner = s.scalar(select(Response.api_key_id).where(Response.id == response_id))
            if owner != api_key_id:
                if owner is None and s.get(DeletedResponse, (response_id, api_key_id)) is None:
                    s.add(DeletedResponse(response_id=response_id, api_key_id=api_key_id, created_at=utcnow()))
                return Deleted(0, 0)
            ids = [response_id, *self._later_turns(s, [response_id])]
            ratings = s.execute(delete(Feedback).where(Feedback.response_id.in_(ids))).rowcount
            self._delete_responses(s, ids)
            deleted = Deleted(len(ids), ratings or 0)
        self.scrub()
        return deleted

    def forget_key(self, api_key_id: str, admin_key_id: str | None = None) -> Deleted:
        """Delete every response served to `api_key_id`, every rating it gave and its daily byte counts,
        record when (from then on the writer stores nothing of this key's), and log an operator event; one
        transaction."""
        with self._deleting() as s:
            ids = select(Response.id).where(Response.api_key_id == api_key_id).scalar_subquery()
            ratings = s.execute(delete(Feedback).where(Feedback.response_id.in_(ids))).rowcount or 0
            ratings += s.execute(delete(Feedback).where(Feedback.api_key_id == api_key_id)).rowcount or 0
            responses = s.execute(delete(Response).where(Response.api_key_id == api_key_id)).rowcount or 0
            s.execute(delete(Grammar).where(Grammar.api_key_id == api_key_id))
            s.execute(delete(KeyBytes).where(KeyBytes.api_key_id == api_key_id))
            row = s.get(ApiKey, api_key_id)
            now = utcnow()
            if row is None:
                s.add(ApiKey(key_id=api_key_id, quarantined=False, forgotten_at=now, updated_at=now))
            else:
                row.forgotten_at, row.updated_at = now, now
            add_event(s, "forget", None, {"key_id": api_key_id, "responses": responses, "ratings": ratings}, admin_key_id)
        self.forgotten.add(api_key_id)
        self.scrub()
        return Deleted(responses, ratings)

    def delete_before(self, cutoff: datetime, batch: int = 1000, term: int | None = None) -> Deleted:
        """Retention: delete responses created before `cutoff` with their ratings, in transactions of
        at most `batch` responses (a big first run never holds one long lock). `term`: the leader's
        (retention runs on the leader): each transaction is fenced, StaleLeader once it no longer leads."""
        total = Deleted(0, 0)
        while True:
            with self._deleting(term) as s:
                ids = list(s.scalars(select(Response.id).where(Response.created_at < cutoff).limit(batch)))
                if not ids:
                    break
                ids += [i for i in self._later_turns(s, ids) if i not in set(ids)]
                ratings = s.execute(delete(Feedback).where(Feedback.response_id.in_(ids))).rowcount or 0
                self._delete_responses(s, ids)
            total = Deleted(total.responses + len(ids), total.ratings + ratings)
        if total.responses:
            self.scrub()
        return total

    @staticmethod
    def _delete_responses(s: Session, ids: list[str]) -> None:
        """Delete the responses `ids`, and the grammars their keys no longer use (store/grammars.py)."""
        keys = list(s.scalars(select(Response.api_key_id).where(Response.id.in_(ids)).distinct()))
        s.execute(delete(Response).where(Response.id.in_(ids)))
        drop_unused(s, keys)

    @staticmethod
    def _later_turns(s: Session, ids: list[str]) -> list[str]:
        """The turns that continue any of `ids`, however far (their prompts carry those turns' text, so
        they go with them: an episode is deleted from the deleted turn on)."""
        tree = descendants_cte(ids)
        return list(s.scalars(select(tree.c.id).distinct()))

    def scrub(self) -> bool:
        """SQLite: checkpoint the WAL into the database and truncate it, so the pages that held deleted
        rows (zeroed in the database by `secure_delete`) leave no copy in the `-wal` file. True when it
        completed; False when readers held it past CHECKPOINT_BUSY_MS (the next deletion's, or SQLite's
        own automatic checkpoints, finish it). PostgreSQL: nothing to do here (True)."""
        if self.dialect != "sqlite":
            return True
        raw = self.db.engine.raw_connection()
        try:
            with busy_timeout(raw.driver_connection, CHECKPOINT_BUSY_MS):
                busy, _, _ = raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            raw.close()
        if busy:
            log.warning("store: the WAL checkpoint after a deletion was blocked by readers; deleted pages may stay in the -wal file until the next one")
        return not busy

    # -- forget that reaches the weights (server/control/forgetting.py plans and runs it) -------------------
    def key_known(self, api_key_id: str) -> bool:
        """Whether the store holds anything of the key: a response, a rating or an api_keys row."""
        with self._session() as s:
            return bool(
                s.scalar(select(exists().where(ApiKey.key_id == api_key_id)))
                or s.scalar(select(exists().where(Response.api_key_id == api_key_id)))
                or s.scalar(select(exists().where(Feedback.api_key_id == api_key_id)))
            )

    def key_rows(self, api_key_id: str) -> tuple[int, int]:
        """(responses served to the key, ratings the key gave or its responses got): what a forget deletes."""
        with self._session() as s:
            responses = s.scalar(select(func.count()).select_from(Response).where(Response.api_key_id == api_key_id)) or 0
            ratings = s.scalar(
                select(func.count()).select_from(Feedback).join(Response, Response.id == Feedback.response_id)
                .where(or_(Feedback.api_key_id == api_key_id, Response.api_key_id == api_key_id))
            ) or 0
            return responses, ratings

    def key_first_rating(self, api_key_id: str, segment: str | None = None) -> int | None:
        """The id of the earliest rating the key gave (or its responses got) that a lineage reads: every
        rating for the base weights' learner (`segment` None), that segment's responses' for an adapter
        lane. None: the lineage never read one of the key's."""
        only = Response.segment == segment if segment is not None else true()
        with self._session() as s:
            return s.scalar(
                select(func.min(Feedback.id)).join(Response, Response.id == Feedback.response_id)
                .where(or_(Feedback.api_key_id == api_key_id, Response.api_key_id == api_key_id), only)
            )

    def replay_count(self, after: int, upto: int, segment: str | None = None, excluding: str | None = None) -> int:
        """How many trainable ratings (as `rated_after` reads them: quarantined keys' left out) lie in
        (after, upto] for a lineage, leaving out the key `excluding`: what a learner moved back to
        `after` trains again up to where it was."""
        only = Response.segment == segment if segment is not None else true()
        q = (
            select(func.count()).select_from(Feedback).join(Response, Response.id == Feedback.response_id)
            .outerjoin(ApiKey, ApiKey.key_id == Feedback.api_key_id)
            .where(Feedback.id > after, Feedback.id <= upto, only, or_(ApiKey.quarantined.is_(None), ApiKey.quarantined.is_(False)))
        )
        if excluding is not None:
            q = q.where(Feedback.api_key_id != excluding, Response.api_key_id != excluding)
        with self._session() as s:
            return s.scalar(q) or 0

    def rewind_lineage(self, cursor_name: str, version: int, last_feedback_id: int) -> tuple[int | None, int]:
        """Point learner `cursor_name` at `version` AND move its feedback position back to
        `last_feedback_id`, in one version-state transaction: the learner reloads `version` when it next
        looks (the lineage changed) and trains every rating after `last_feedback_id` again. A publish on
        the old lineage that races it is refused by the store's lineage check. Returns the cursor's
        (version, position) before."""
        with self.db.version_transaction() as s:
            row = s.get(LearnerCursor, cursor_name, with_for_update=True)
            before = (row.policy_version, row.last_feedback_id) if row is not None else (None, 0)
            if row is None:
                s.add(LearnerCursor(name=cursor_name, last_feedback_id=last_feedback_id, policy_version=version))
            else:
                row.policy_version, row.last_feedback_id, row.updated_at = version, last_feedback_id, utcnow()
            return before
