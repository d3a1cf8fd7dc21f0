"""The scaffolding of an engine whose model lives on ONE worker thread (the `hf` and `diffusion`
backends): the version gate, the inbox the thread reads (requests and weight swaps), the bridge that
turns a request's deltas from the thread into an async stream, per-request seeded generators, and the
drained weight swap that restores the old weights if the new ones fail to load.

A swap that ends a straggler (drain deadline) sets its job's `cancelled` event, then queues the swap
on the same inbox; the worker reads the inbox in order and checks `cancelled` before every step, so it
never computes a token of that job once the swap has run. Its stream ends with an "abort" delta at the
next read (what the worker produced and the stream had not handed over yet is dropped), and a stream
that had not started yet never starts.

A backend supplies `start` (load the model, then `_start_worker`), `_job` (its per-request state,
holding the given `cancelled` event), `_run` (the worker loop: how requests are scheduled; it emits
`aborted()` for each job it drops as cancelled, and drops every job still held when a swap arrives)
and `_load_state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import torch

from liveloop.server.engines.base import Generation, GenerationRequest, TokenDelta, VersionGate, aborted

Emit = Callable[[TokenDelta | BaseException], None]


class ThreadedEngine:
    thread_name = "liveloop-engine"

    def __init__(self, config: Any, model_path: str | Path):
        self.config = config
        self.model_path = str(model_path)
        self.max_model_len = config.max_model_len
        self._gate = VersionGate(0, config.drain_deadline_seconds)
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._seed_source = torch.Generator().manual_seed(config.seed)

    @property
    def version(self) -> int:
        return self._gate.version

    @property
    def swap_preempted(self) -> int:
        return self._gate.preempted

    def healthy(self) -> bool:
        """The worker thread that owns the model is running (it never blocks)."""
        return self._thread is not None and self._thread.is_alive() and not self._closing.is_set()

    def _start_worker(self, version: int) -> None:
        self._gate.version = version
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    async def close(self) -> None:
        self._closing.set()
        self._inbox.put(None)
        if self._thread:
            await asyncio.to_thread(self._thread.join, 10)

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Generation]:
        cancelled = threading.Event()

        async def preempt() -> None:
            # the swap is queued on the inbox after this: the worker sees the flag before it runs
            cancelled.set()

        async with self._gate.reading(preempt) as version:
            yield Generation(version, self._stream(request, cancelled))

    async def _stream(self, request: GenerationRequest, cancelled: threading.Event) -> AsyncIterator[TokenDelta]:
        if cancelled.is_set():  # ended by a swap before it started: nothing to generate
            yield aborted()
            return
        loop = asyncio.get_running_loop()
        out: asyncio.Queue = asyncio.Queue()

        def emit(item: TokenDelta | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any more
                loop.call_soon_threadsafe(out.put_nowait, item)

        seed = request.sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._seed_source))
        job = self._job(request, emit, torch.Generator().manual_seed(seed), cancelled)
        self._inbox.put(job)
        try:
            while not cancelled.is_set():
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                if cancelled.is_set():
                    break
                yield item
                if item.finish_reason is not None:
                    return
            yield aborted()  # a swap ended it: what it produced and was not handed over yet is dropped
        finally:
            cancelled.set()

    async def update_weights(self, weights: Any, version: int) -> float:
        async def apply() -> None:
            loop = asyncio.get_running_loop()
            done: asyncio.Future = loop.create_future()

            def swap() -> None:
                backup = {k: v.clone() for k, v in self._weights_module().state_dict().items()}
                try:
                    self._load_state(weights)
                except BaseException as exc:  # restore: never serve a half-copied model
                    self._load_state(backup)
                    loop.call_soon_threadsafe(done.set_exception, exc)
                    return
                loop.call_soon_threadsafe(done.set_result, None)

            self._inbox.put(swap)
            await done

        return await self._gate.swap(apply, version)

    # -- what a backend supplies ---------------------------------------------------------------------
    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> Any:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def _weights_module(self) -> torch.nn.Module:
        raise NotImplementedError

    def _load_state(self, weights: Any) -> None:
        raise NotImplementedError
