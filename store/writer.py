"""Group-commit writer: the server logs responses and feedback through one background thread.

A request hands its record to `submit` and gets a future; the thread takes everything queued (up to
`batch_max`), writes it in ONE transaction and resolves the futures. Generation never waits on the
database; a request is acknowledged to its client only after its future resolves, so an acknowledged
response is always durable, and under load many requests share one commit. One writer per server
process also serialises feedback ids with commit order, which the learner's cursor relies on.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future

from liveloop.store.store import Store, WriteOp

log = logging.getLogger(__name__)

_STOP = object()


class BatchWriter:
    def __init__(self, store: Store, batch_max: int | None = None, queue_max: int | None = None):
        self.store = store
        self.batch_max = batch_max or store.config.batch_max
        self._queue: queue.Queue = queue.Queue(maxsize=queue_max or store.config.queue_max)
        self._thread = threading.Thread(target=self._run, name="liveloop-store-writer", daemon=True)
        self.batches = 0
        self.rows = 0
        self.commit_seconds = 0.0
        self._started = False

    def start(self) -> "BatchWriter":
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def submit(self, op: WriteOp) -> Future:
        if not self._started:
            raise RuntimeError("BatchWriter not started")
        fut: Future = Future()
        self._queue.put((op, fut))
        return fut

    async def write(self, op: WriteOp):
        """Submit and wait for the commit; raises what the operation raised."""
        fut = self.submit(op)
        result = await asyncio.wrap_future(fut)
        return result

    def close(self, timeout: float = 30.0) -> None:
        """Flush everything queued, then stop the thread."""
        if self._started:
            self._queue.put((_STOP, None))
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
                self._commit(batch)

    def _commit(self, batch: list[tuple[WriteOp, Future]]) -> None:
        start = time.perf_counter()
        ops = [op for op, _ in batch]
        try:
            results = self.store.write_batch(ops)
        except Exception as exc:  # the database is down: fail these requests, keep serving
            log.exception("store write of %d rows failed", len(ops))
            for _, fut in batch:
                fut.set_exception(exc)
            return
        self.commit_seconds += time.perf_counter() - start
        self.batches += 1
        self.rows += len(ops)
        for (_, fut), result in zip(batch, results):
            if isinstance(result, Exception):
                fut.set_exception(result)
            else:
                fut.set_result(result)
