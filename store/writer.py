"""Group-commit writer: the server logs responses and feedback through one background thread.

A request hands its record to `submit` and gets a future; the thread takes everything queued (up to
`batch_max`), writes it in ONE transaction and resolves the futures. Generation never waits on the
database; a request is acknowledged to its client only after its future resolves, so an acknowledged
response is always durable, and under load many requests share one commit. Several server processes
(replicas) may each run a writer on one store: feedback ids are commit order all the same (SQLite has
one writer at a time; PostgreSQL hands ids out from a counter whose row lock is held to commit, see
store/feedback.py `_insert_ratings`), which the learner's cursor relies on.

A caller that goes away (a cancelled request) only stops waiting; its record is still written, once,
and no future is resolved twice or after it was cancelled. The queue is bounded: when full, `submit`
raises `WriterFull` at once (the edge answers 503 with Retry-After) instead of blocking the event loop.
`health()` says whether the thread lives, whether the last commit took, and how long the oldest
waiting write has waited (a stalled store shows there first).

A stalled store costs a bounded wait. An async caller waits at most `[store] write_deadline_seconds`
(`WriterSlow`: the edge answers 503 + Retry-After; the write is not acknowledged, though it may still
land). The writer waits at most as long for a locked database, then fails the whole batch at once: a
database that cannot take writes (locked, unreachable) is never retried row by row; only a row-specific
failure (a constraint, a value the database cannot hold) sends the batch to row-by-row isolation.
Deletions hold for what is still on its way: each transaction begins holding the write lock and drops
what a deletion marked (a deleted response's tombstone, a forgotten key: store/rights.py), so a delete
or a forget that came first is never undone when the row lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from liveloop.store.db import busy_timeout
from liveloop.store.records import ResponseRecord
from liveloop.store.feedback import WriteOp, response_row
from liveloop.store.store import Store

log = logging.getLogger(__name__)

_STOP = object()


class WriterFull(RuntimeError):
    """The writer's queue is full: the caller should retry later."""


class WriterDown(RuntimeError):
    """The writer thread is not running: nothing can be logged."""


class WriterSlow(TimeoutError):
    """The write was not committed within the deadline (the store is stalled or locked): the caller must
    not acknowledge it; it may still be written."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


_UNAVAILABLE = ("OperationalError", "InterfaceError")  # PEP 249's names, in every driver (raw COPY raises the driver's)


def store_unavailable(exc: BaseException) -> bool:
    """A failure of the database, not of a row: locked, unreachable, timed out. A batch that fails so is
    failed whole (retrying it row by row would wait on the same lock once per row)."""
    if isinstance(exc, (OperationalError, InterfaceError, TimeoutError)):
        return True
    return any(cls.__name__ in _UNAVAILABLE for cls in type(exc).__mro__)


@dataclass(frozen=True)
class WriterHealth:
    alive: bool  # the thread runs
    store_ok: bool  # the last commit succeeded (or none failed yet)
    queued: int
    queue_max: int
    last_error: str | None
    failed_commits: int
    oldest_age: float = 0.0  # seconds the oldest write not yet committed has waited (0: none waits)
    stalled: bool = False  # oldest_age is over `[store] writer_stall_seconds`


def _resolve(fut: Future, result: object = None, exc: BaseException | None = None) -> None:
    """Resolve `fut` unless its waiter cancelled it (then nobody is listening)."""
    if not fut.set_running_or_notify_cancel():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _settle(outcomes: list[tuple[asyncio.Future, object]]) -> None:
    """On the futures' own loop: resolve each unless its waiter went away (cancelled it)."""
    for fut, outcome in outcomes:
        if fut.done():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)


def _prepared(op: WriteOp) -> dict | None:
    """A response's row, encoded by the submitting thread while the writer commits the previous
    batch; None (the writer builds it, and fails it alone if it must) for ratings and for records
    the encoder refuses, so that `submit` itself raises only WriterFull / WriterDown."""
    if not isinstance(op, ResponseRecord):
        return None
    try:
        return response_row(op)
    except Exception:
        return None


def _settle_all(batch: list[tuple], outcomes: list[object]) -> None:
    """Resolve a batch's futures with their outcomes (a result or an exception), skipping any already
    done: thread futures here, each event loop's futures in one call on that loop. Callers on an event
    loop (`write`, `submit_async`) get an asyncio future of their own loop, and a commit settles all of
    one loop's futures with ONE `call_soon_threadsafe`: a batch of 500 costs the loop one wake-up
    instead of 500 cross-thread callbacks, which is what kept a busy server's writer far below the
    database's pace."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, object]]] = {}
    for (_, fut, *_), outcome in zip(batch, outcomes):
        if isinstance(fut, Future):
            if fut.done():
                continue
            if isinstance(outcome, BaseException):
                _resolve(fut, exc=outcome)
            else:
                _resolve(fut, outcome)
        else:
            by_loop.setdefault(fut.get_loop(), []).append((fut, outcome))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, pairs)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


class _Mailbox:
    """The writer's bounded FIFO. The writer takes a whole batch under one lock (a `queue.Queue`
    costs a lock round trip and a notify per item, on both sides, for every row)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: deque = deque()
        self._ready = threading.Condition(threading.Lock())

    def offer(self, item: tuple, bounded: bool = True) -> bool:
        """Append `item`; False (and nothing queued) when bounded and full."""
        with self._ready:
            if bounded and len(self._items) >= self.maxsize:
                return False
            self._items.append(item)
            if len(self._items) == 1:  # the writer waits only on an empty mailbox
                self._ready.notify()
        return True

    def take(self, most: int) -> list[tuple]:
        """Up to `most` items, oldest first; blocks until there is one."""
        with self._ready:
            while not self._items:
                self._ready.wait()
            return [self._items.popleft() for _ in range(min(most, len(self._items)))]

    def take_all(self) -> list[tuple]:
        with self._ready:
            items = list(self._items)
            self._items.clear()
            return items

    def qsize(self) -> int:
        return len(self._items)

    def oldest(self) -> float | None:
        """When the oldest waiting item was queued (time.monotonic), None when empty."""
        with self._ready:
            return self._items[0][-1] if self._items else None


class BatchWriter:
    def __init__(self, store: Store, batch_max: int | None = None, queue_max: int | None = None):
        self.store = store
        self.feedback = store.feedback  # the part it writes through
        self.batch_max = batch_max or store.config.batch_max
        self.queue_max = queue_max or store.config.queue_max
        self._queue = _Mailbox(self.queue_max)
        self._thread = threading.Thread(target=self._run, name="liveloop-store-writer", daemon=True)
        self.batches = 0
        self.rows = 0
        self.commit_seconds = 0.0
        self.failed_commits = 0
        self.rejected = 0
        self.timed_out = 0  # waits that passed the deadline
        self._last_error: str | None = None
        self._store_ok = True
        self._started = False
        self.deadline = store.config.write_deadline_seconds
        self.stall_seconds = store.config.writer_stall_seconds
        self._committing_since: float | None = None  # the batch being written: when its oldest item was queued

    def start(self) -> "BatchWriter":
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def health(self) -> WriterHealth:
        age = self.oldest_age()
        return WriterHealth(
            alive=self._started and self._thread.is_alive(),
            store_ok=self._store_ok,
            queued=self._queue.qsize(),
            queue_max=self.queue_max,
            last_error=self._last_error,
            failed_commits=self.failed_commits,
            oldest_age=age,
            stalled=age > self.stall_seconds,
        )

    def oldest_age(self) -> float:
        """Seconds the oldest write not committed yet (being written, or queued) has waited; 0 if none."""
        times = [t for t in (self._committing_since, self._queue.oldest()) if t is not None]
        return max(0.0, time.monotonic() - min(times)) if times else 0.0

    def submit(self, op: WriteOp) -> Future:
        """Queue `op`; raises WriterFull when the queue is full and WriterDown when the thread is not running."""
        fut: Future = Future()
        self._put(op, fut)
        return fut

    def submit_async(self, op: WriteOp) -> asyncio.Future:
        """`submit` for a caller on an event loop: a future of the running loop, resolved after the
        commit. Raises WriterFull / WriterDown at once, before anything is queued. Cancelling the
        future only stops the wait: the record is still written."""
        fut = asyncio.get_running_loop().create_future()
        self._put(op, fut)
        return fut

    async def write(self, op: WriteOp):
        """Submit and wait for the commit; raises what the operation raised, or WriterSlow past the
        deadline. If the caller is cancelled while waiting, the write still happens (the writer skips a
        cancelled future)."""
        return await self.wait(self.submit_async(op))

    async def wait(self, fut: asyncio.Future):
        """The outcome of a `submit_async` future, waited for at most `[store] write_deadline_seconds`;
        beyond it WriterSlow (the future is cancelled: the write itself still happens, unacknowledged)."""
        try:
            return await asyncio.wait_for(fut, self.deadline)
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                raise
            self.timed_out += 1
            raise WriterSlow(
                f"the store did not take the write within {self.deadline:g} s", retry_after=max(1, round(self.deadline))
            ) from None

    def _put(self, op: WriteOp, fut: object) -> None:
        if not self._started or not self._thread.is_alive():
            raise WriterDown("the store writer is not running")
        if not self._queue.offer((op, fut, _prepared(op), time.monotonic())):
            self.rejected += 1
            raise WriterFull(f"the store writer has {self.queue_max} writes waiting")

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued, then stop the thread."""
        if self._started:
            self._queue.offer((_STOP, None, None, time.monotonic()), bounded=False)
            self._thread.join(timeout)
            self._started = False

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = self._queue.take(self.batch_max)
            if any(item[0] is _STOP for item in batch):
                stopping = True
                # drain whatever else is queued before stopping
                batch = [item for item in batch + self._queue.take_all() if item[0] is not _STOP]
            if batch:
                self._committing_since = batch[0][-1]
                try:
                    self._commit(batch)
                except BaseException as exc:  # never let the thread die: fail this batch, keep going
                    log.exception("store writer: unexpected failure on a batch of %d", len(batch))
                    failure = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
                    _settle_all(batch, [failure] * len(batch))
                finally:
                    self._committing_since = None

    def _commit(self, batch: list[tuple[WriteOp, Future | asyncio.Future, dict | None, float]]) -> None:
        start = time.perf_counter()
        ops = [op for op, *_ in batch]
        try:
            results = self._write(ops, [row for _, _, row, _ in batch])
        except Exception as exc:  # the database is down or locked: fail these requests, keep serving
            log.error("store write of %d rows failed: %s", len(ops), exc)
            self.failed_commits += 1
            self._store_ok = False
            self._last_error = f"{type(exc).__name__}: {exc}"[:500]
            _settle_all(batch, [exc] * len(batch))
            return
        self._store_ok = True
        self.commit_seconds += time.perf_counter() - start
        self.batches += 1
        self.rows += len(ops)
        _settle_all(batch, results)

    def _write(self, ops: list[WriteOp], rows: list[dict | None]) -> list[Any]:
        """The batch in one transaction whose wait for the database's lock is bounded by the deadline;
        a failure of the database fails it whole, a failure of a row goes to the store's row-by-row
        isolation (`store.feedback.write_batch`, which tries the batch once more, then each op alone)."""
        try:
            return self._write_whole(ops, rows)
        except Exception as exc:
            if store_unavailable(exc) or len(ops) == 1:
                raise
            log.warning("store write of %d rows failed on a row (%s): writing them one by one", len(ops), exc)
        return self.feedback.write_batch(ops, rows)

    def _write_whole(self, ops: Sequence[WriteOp], rows: Sequence[dict[str, Any] | None]) -> list[Any]:
        with _bounded_transaction(self.feedback.db.writing, self.deadline) as conn:
            return self.feedback.apply_batch(conn, ops, rows)  # the one-transaction apply (write_batch's first try)


@contextlib.contextmanager
def _bounded_transaction(engine: Engine, seconds: float) -> Iterator[Connection]:
    """A transaction that waits at most `seconds` for a lock: SQLite's busy timeout (a connection
    setting, set on the driver's connection before the transaction begins, since the write path's
    transactions take the write lock when they begin; restored after), PostgreSQL's lock and statement
    timeouts (SET LOCAL: this transaction only)."""
    ms = max(1, int(seconds * 1000))
    with engine.connect() as conn:
        if conn.dialect.name != "sqlite":
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ms}")
                    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")
                yield conn
            return
        # no statement through SQLAlchemy: that would begin the transaction
        with busy_timeout(conn.connection.driver_connection, ms), conn.begin():
            yield conn
