"""Group-commit writer: the server logs responses and feedback through one background thread.

A request hands its record to `submit` and gets a future; the thread takes everything queued (up to
`batch_max`), writes it in ONE transaction and resolves the futures. Generation never waits on the
database; a request is acknowledged to its client only after its future resolves, so an acknowledged
response is always durable, and under load many requests share one commit. One writer per server
process also serialises feedback ids with commit order, which the learner's cursor relies on.

The write path cannot die of what its callers do: a caller that goes away (a cancelled request) only
stops waiting; its record is still written, once, and the thread never resolves a future twice or
one that was cancelled. The queue is bounded: when it is full `submit` raises `WriterFull` at once
(the edge answers 503 with Retry-After) instead of blocking the event loop. `health()` says whether
the thread lives and whether the database took the last commit.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from liveloop.store.store import Store, WriteOp

log = logging.getLogger(__name__)

_STOP = object()


class WriterFull(RuntimeError):
    """The writer's queue is full: the caller should retry later."""


class WriterDown(RuntimeError):
    """The writer thread is not running: nothing can be logged."""


@dataclass(frozen=True)
class WriterHealth:
    alive: bool  # the thread runs
    store_ok: bool  # the last commit succeeded (or none failed yet)
    queued: int
    queue_max: int
    last_error: str | None
    failed_commits: int


def _resolve(fut: Future, result: object = None, exc: BaseException | None = None) -> None:
    """Resolve `fut` unless its waiter cancelled it (then nobody is listening)."""
    if not fut.set_running_or_notify_cancel():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class BatchWriter:
    def __init__(self, store: Store, batch_max: int | None = None, queue_max: int | None = None):
        self.store = store
        self.batch_max = batch_max or store.config.batch_max
        self.queue_max = queue_max or store.config.queue_max
        self._queue: queue.Queue = queue.Queue(maxsize=self.queue_max)
        self._thread = threading.Thread(target=self._run, name="liveloop-store-writer", daemon=True)
        self.batches = 0
        self.rows = 0
        self.commit_seconds = 0.0
        self.failed_commits = 0
        self.rejected = 0
        self._last_error: str | None = None
        self._store_ok = True
        self._started = False

    def start(self) -> "BatchWriter":
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def health(self) -> WriterHealth:
        return WriterHealth(
            alive=self._started and self._thread.is_alive(),
            store_ok=self._store_ok,
            queued=self._queue.qsize(),
            queue_max=self.queue_max,
            last_error=self._last_error,
            failed_commits=self.failed_commits,
        )

    def submit(self, op: WriteOp) -> Future:
        """Queue `op`; raises WriterFull when the queue is full and WriterDown when the thread is not running."""
        if not self._started or not self._thread.is_alive():
            raise WriterDown("the store writer is not running")
        fut: Future = Future()
        try:
            self._queue.put_nowait((op, fut))
        except queue.Full:
            self.rejected += 1
            raise WriterFull(f"the store writer has {self.queue_max} writes waiting") from None
        return fut

    async def write(self, op: WriteOp):
        """Submit and wait for the commit; raises what the operation raised. If the caller is
        cancelled while waiting, the write still happens (the shield keeps the future alive)."""
        fut = self.submit(op)
        return await asyncio.shield(asyncio.wrap_future(fut))

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued, then stop the thread."""
        if self._started:
            while self._thread.is_alive():
                try:
                    self._queue.put((_STOP, None), timeout=0.5)
                    break
                except queue.Full:
                    continue
            self._thread.join(timeout)
            self._started = False

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self.batch_max:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if any(op is _STOP for op, _ in batch):
                stopping = True
                batch = [(op, f) for op, f in batch if op is not _STOP]
                # drain whatever else is queued before stopping
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            if batch:
                try:
                    self._commit(batch)
                except BaseException as exc:  # never let the thread die: fail this batch, keep going
                    log.exception("store writer: unexpected failure on a batch of %d", len(batch))
                    for _, fut in batch:
                        if not fut.done():
                            _resolve(fut, exc=exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    def _commit(self, batch: list[tuple[WriteOp, Future]]) -> None:
        start = time.perf_counter()
        ops = [op for op, _ in batch]
        try:
            results = self.store.write_batch(ops)
        except Exception as exc:  # the database is down: fail these requests, keep serving
            log.error("store write of %d rows failed: %s", len(ops), exc)
            self.failed_commits += 1
            self._store_ok = False
            self._last_error = f"{type(exc).__name__}: {exc}"[:500]
            for _, fut in batch:
                _resolve(fut, exc=exc)
            return
        self._store_ok = True
        self.commit_seconds += time.perf_counter() - start
        self.batches += 1
        self.rows += len(ops)
        for (_, fut), result in zip(batch, results):
            if isinstance(result, Exception):
                _resolve(fut, exc=result)
            else:
                _resolve(fut, result)
