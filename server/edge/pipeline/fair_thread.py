"""A thread shared fairly between API keys. The edge runs two: the prompt thread, which templates and
tokenizes every request (the tokenizer must not run two encodes at once), and the grammar thread, which
checks constraints (server/edge/pipeline/grammar_check.py). Each key's jobs wait
in a queue of their own, and the thread takes one job from each waiting key in turn, so one key's flood
delays another key's job by at most one job per other waiting key, never by the whole flood. A key may
have `per_key` jobs waiting (Busy beyond: 429), and a job whose caller went away before it started
(the client disconnected) is skipped, not run.

    thread = FairThread(per_key=32)
    ids = await thread.run(key_id, lambda: tokenizer.encode(text))
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from liveloop.server.edge.admission import Busy


@dataclass
class _Job:
    work: Callable[[], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    abandoned: bool = field(default=False)  # its caller stopped waiting before it started


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class FairThread:
    """One worker thread; each key's jobs in a queue of their own, taken one per waiting key in turn."""

    def __init__(self, per_key: int, name: str = "liveloop-prompts"):
        self.per_key = per_key
        self._ready = threading.Condition()
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()  # keys with waiting jobs, next turn first
        self._closed = False
        self.skipped = 0  # jobs whose caller left before they started
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def run(self, key: str, work: Callable[[], Any]) -> Any:
        """`work()` on the thread, in `key`'s turn; its result or its exception. Raises Busy when `key`
        has `per_key` jobs waiting already."""
        loop = asyncio.get_running_loop()
        job = _Job(work, loop.create_future(), loop)
        with self._ready:
            if self._closed:
                raise RuntimeError("the prompt thread is closed")
            queue = self._queues.setdefault(key, deque())
            if len(queue) >= self.per_key:
                raise Busy(f"this API key has {self.per_key} requests waiting to be prepared", retry_after=1)
            queue.append(job)
            self._ready.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.abandoned = True
            raise

    def waiting(self) -> int:
        """Jobs waiting to start, all keys."""
        with self._ready:
            return sum(len(q) for q in self._queues.values())

    def _next(self) -> _Job | None:
        """The next key's oldest job (that key then waits its turn behind the others); None when closed."""
        with self._ready:
            while not self._queues and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            key, queue = next(iter(self._queues.items()))
            job = queue.popleft()
            if queue:
                self._queues.move_to_end(key)
            else:
                del self._queues[key]
            return job

    def _serve(self) -> None:
        while (job := self._next()) is not None:
            if job.abandoned or job.future.cancelled():
                self.skipped += 1
                continue
            try:
                result, error = job.work(), None
            except BaseException as exc:  # the caller gets it, as run_in_executor would hand it over
                result, error = None, exc
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            except RuntimeError:  # the caller's event loop is closed: nobody waits
                pass

    def close(self) -> None:
        """Stop taking jobs; the running one finishes, waiting ones are cancelled."""
        with self._ready:
            self._closed = True
            waiting = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._ready.notify_all()
        for job in waiting:
            try:
                job.loop.call_soon_threadsafe(job.future.cancel)
            except RuntimeError:  # that loop is closed
                pass
