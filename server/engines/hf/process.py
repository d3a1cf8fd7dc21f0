"""The `hf` backend in a process of its own (`[engine] hf_worker = "process"`): `HFProcessEngine`, the
server's side. The child (hf/child.py) runs the same `HFEngine` worker thread, unchanged; the two speak
the typed messages of hf/protocol.py over one pipe.

The parent keeps what the server sees: the version gate, the adapter table, seeds drawn from
`engine.seed` as the in-thread engine draws them, and a stream per request that ends with "abort" when
a swap preempts it. Tensors are scanned for non-finite values here, before they are sent.

Faults: if the child dies (killed, out of memory, its worker stopped after a failed copy), the pipe
ends: every running stream ends with an error, every waiting swap or adapter load fails, and
`healthy()` is False from then on; nothing is served from a half-copied model. Why a process at all:
docs/engines.md ("The hf engine in a process of its own").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from liveloop.server.engines.base import GenerationRequest, Preempt, TokenDelta, aborted
from liveloop.server.engines.gated import GatedEngine
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.engines.hf.protocol import (
    Cancel,
    Channel,
    Deltas,
    Done,
    DropAdapter,
    Failed,
    LoadAdapter,
    Start,
    Stop,
    Submit,
    Swap,
    ToEngine,
)
from liveloop.server.engines.threaded import deliver, request_seed
from liveloop.transport.weights import NamedTensors, WeightSource, scanned

if TYPE_CHECKING:
    from liveloop.server.engines.adapters import AdapterSpec
    from liveloop.server.config import EngineConfig

log = logging.getLogger(__name__)


class EngineProcessExited(RuntimeError):
    """The engine's process ended: what was running on it has ended with it."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue


SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|PGPASS|CREDENTIAL", re.IGNORECASE)


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The engine process's environment: the server's without what looks like a secret (API keys, tokens,
    passwords: the engine reads none of them, and a process that holds none can leak none)."""
    return {k: v for k, v in environ.items() if not SECRET.search(k)}


class HFProcessEngine(GatedEngine):
    name = "hf"
    keeps_generations = HFEngine.keeps_generations
    supports_constraints = HFEngine.supports_constraints
    sampling_extensions = HFEngine.sampling_extensions
    logprobs_of = HFEngine.logprobs_of

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.supports_adapters = config.max_adapters > 0
        self._process: subprocess.Popen | None = None
        self._pipe: Channel | None = None
        self._reader: threading.Thread | None = None
        self._streams: dict[str, _Stream] = {}
        self._replies: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._seed_source = torch.Generator().manual_seed(config.seed)  # as the in-thread engine draws seeds
        self._exited = threading.Event()
        self._closing = False

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        # a fresh interpreter (never a fork of a process that holds threads and a loop), started as a
        # module: nothing of the parent's main module is run again
        ours, theirs = multiprocessing.Pipe()
        self._process = subprocess.Popen(  # -P: the working directory is not put first on its import path
            [sys.executable, "-P", "-m", "liveloop.server.engines.hf.child", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
            env=child_env(os.environ),
        )
        theirs.close()
        self._pipe = Channel(ours)
        try:
            self._pipe.send(Start(self.config, self.model_path, version, weights_path and str(weights_path)))
            first = await asyncio.to_thread(self._pipe.receive)
        except (EOFError, OSError):
            code = await asyncio.to_thread(self._process.wait, 10)
            raise EngineProcessExited(f"hf engine process exited while starting (exit code {code})") from None
        if isinstance(first, Failed):
            await asyncio.to_thread(self._process.wait, 10)
            raise first.error
        self._gate.version = version
        self._reader = threading.Thread(target=self._read, name="liveloop-hf-engine-reader", daemon=True)
        self._reader.start()

    def healthy(self) -> bool:
        """The engine's process is running and has not ended (nor is being closed)."""
        return self._process is not None and self._process.poll() is None and not self._exited.is_set() and not self._closing

    async def close(self) -> None:
        self._closing = True
        if self._process is None:
            return
        if not self._exited.is_set():
            with contextlib.suppress(OSError):
                self._pipe.send(Stop())
        try:
            await asyncio.to_thread(self._process.wait, 10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        self._pipe.close()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join, 5)

    # -- the parent's reader thread --------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                message = self._pipe.receive()
            except (EOFError, OSError):
                break
            match message:
                case Deltas(items):
                    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
                    for rid, item in items:
                        stream = self._streams.get(rid)
                        if stream is not None:  # else its reader has left
                            by_loop.setdefault(stream.loop, []).append((stream.out, item))
                    for loop, batch in by_loop.items():
                        with contextlib.suppress(RuntimeError):  # the loop has closed
                            loop.call_soon_threadsafe(deliver, batch)
                case Done(mid, error, seconds):
                    self._settle(mid, error, seconds)
        self._exited.set()
        if not self._closing:
            code = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._process.wait(1)
            log.critical("hf engine process exited (exit code %s): its generations end with an error", code)
        ended = EngineProcessExited("hf engine process exited")
        for stream in list(self._streams.values()):
            with contextlib.suppress(RuntimeError):
                stream.loop.call_soon_threadsafe(deliver, [(stream.out, ended)])
        for mid in list(self._replies):
            self._settle(mid, ended, 0.0)

    def _settle(self, mid: int, error: BaseException | None, seconds: float) -> None:
        entry = self._replies.pop(mid, None)
        if entry is None:
            return
        loop, future = entry

        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(seconds)
            else:
                future.set_exception(error)

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle)

    async def _ask(self, message: Callable[[int], ToEngine]) -> float:
        """Send `message(mid)` from a thread (it may carry tensors) and wait for the child's answer."""
        if not self.healthy():
            raise EngineProcessExited("hf engine process is not running (not started, closed, or exited)")
        mid = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._replies[mid] = (loop, future)
        try:
            await asyncio.to_thread(self._pipe.send, message(mid))
        except BaseException:
            self._replies.pop(mid, None)
            raise
        if self._exited.is_set():  # ended while we sent: the reader may have settled before we registered
            self._settle(mid, EngineProcessExited("hf engine process exited"), 0.0)
        return await future

    # -- what GatedEngine asks of a backend ------------------------------------------------------------
    def _admit(self, request: GenerationRequest, adapter: str | None = None) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        rid = str(next(self._ids))
        preempted = threading.Event()

        async def preempt() -> None:
            preempted.set()  # sent before the swap that preempts it: the child drops it first
            with contextlib.suppress(OSError):
                self._pipe.send(Cancel(rid))

        return preempt, self._stream(rid, request, preempted, adapter)

    async def _stream(self, rid: str, request: GenerationRequest, preempted: threading.Event,
                      adapter: str | None) -> AsyncIterator[TokenDelta]:
        if preempted.is_set():  # ended by a swap before it started
            yield aborted()
            return
        if not self.healthy():
            raise EngineProcessExited("hf engine process is not running (not started, closed, or exited)")
        seed = request_seed(request, self._seed_source)
        out: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = _Stream(asyncio.get_running_loop(), out)
        finished = False
        try:
            self._pipe.send(Submit(rid, request, adapter, seed))
            while not preempted.is_set():
                item = await out.get()
                if isinstance(item, BaseException):
                    finished = True  # the child ended it (or ended)
                    raise item
                if preempted.is_set():
                    break
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
            yield aborted()
        finally:
            self._streams.pop(rid, None)
            if not finished and not preempted.is_set() and not self._exited.is_set():
                with contextlib.suppress(OSError):  # its reader left: free its row
                    self._pipe.send(Cancel(rid))

    def _stage(self, source: WeightSource) -> WeightSource:
        # tensors are scanned here, before they are sent; a checkpoint is read by the child
        if isinstance(source, NamedTensors) and not source.verified:
            source = scanned(NamedTensors({k: v.detach().cpu() for k, v in source.tensors.items()}))
        return source

    async def _apply_as(self, source: WeightSource, version: int) -> float:
        return await self._ask(lambda mid: Swap(mid, source, version, self.swap_keeps))

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        await self._ask(lambda mid: LoadAdapter(mid, spec, name))

    def _unload_adapter(self, name: str) -> None:
        if not self._exited.is_set():
            with contextlib.suppress(OSError):
                self._pipe.send(DropAdapter(name))
