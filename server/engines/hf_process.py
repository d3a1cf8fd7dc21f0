"""The `hf` backend in a process of its own (`[engine] hf_worker = "process"`).

Why: on a small model the hf engine's steps are mostly Python (module calls, sampling), so they hold
the interpreter lock; on a thread of the server's process they share one interpreter with the event
loop, the request parsing, the chat template and the logging writer, and the whole process runs on at
most one core (measured: docs/results/serving.md). In a process of its own the engine has its own
interpreter and core, as vLLM's engine core does.

The child runs the same `HFEngine` worker thread, unchanged: the same batched steps, keep swaps,
adapters, grammars and hand-overs. What crosses the pipe is plain data, pickled (no function):

    parent -> child   ("submit", rid, GenerationRequest, adapter, seed)   ("cancel", rid)
                      ("swap", mid, WeightSource, version, keep)           ("load_adapter", mid, spec, name)
                      ("drop_adapter", name)                                ("stop",)
    child -> parent   ("ready",) | ("failed", error)                       ("deltas", [(rid, delta | error), ...])
                      ("done", mid, error | None, copy seconds)

Deltas cross once per hand-over of the worker (one message for every stream's new tokens), so the pipe
costs one write per step, not one per token. The parent keeps what the server sees: the version gate,
the adapter table, seeds drawn from `engine.seed` as the in-thread engine draws them, and a stream per
request that ends with "abort" when a swap preempts it. A checkpoint crosses as its path and is read in
the child beside its generation; tensors cross by value, scanned for non-finite values before they go.

Faults: if the child dies (killed, out of memory, its worker stopped after a failed copy), the pipe
ends: every running stream ends with an error, every waiting swap or adapter load fails, and
`healthy()` is False from then on; nothing is served from a half-copied model. If the parent dies the
child reads the end of the pipe and exits. The child ignores SIGINT and SIGTERM, which a terminal or a
supervisor sends to the whole process group: the server stops it in order once its own streams ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import GenerationRequest, Preempt, TokenDelta, aborted
from liveloop.server.engines.gated import GatedEngine
from liveloop.server.engines.hf_engine import HFEngine
from liveloop.server.engines.threaded import DropAdapter, LoadAdapter, Stop, Submit, Swap, _deliver, request_seed
from liveloop.transport.weights import NamedTensors, WeightSource, scanned

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from liveloop.server.config import EngineConfig

log = logging.getLogger(__name__)


class EngineProcessExited(RuntimeError):
    """The engine's process ended: what was running on it has ended with it."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue


class _Pipe:
    """One end of the pipe: whole pickled messages, sent by any thread one at a time."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def receive(self) -> tuple:
        return pickle.loads(self.conn.recv_bytes())


def _portable(error: BaseException | None) -> BaseException | None:
    """`error` if it survives pickling, else a RuntimeError that says what it was."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class HFProcessEngine(GatedEngine):
    name = "hf"
    keeps_generations = HFEngine.keeps_generations
    supports_constraints = HFEngine.supports_constraints
    sampling_extensions = HFEngine.sampling_extensions

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.supports_adapters = config.max_adapters > 0
        self._process: subprocess.Popen | None = None
        self._pipe: _Pipe | None = None
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
        self._process = subprocess.Popen(
            [sys.executable, "-m", "liveloop.server.engines.hf_process", str(theirs.fileno())], pass_fds=(theirs.fileno(),)
        )
        theirs.close()
        self._pipe = _Pipe(ours)
        try:
            self._pipe.send(("start", self.config, self.model_path, version, weights_path and str(weights_path)))
            first = await asyncio.to_thread(self._pipe.receive)
        except (EOFError, OSError):
            code = await asyncio.to_thread(self._process.wait, 10)
            raise EngineProcessExited(f"hf engine process exited while starting (exit code {code})") from None
        if first[0] == "failed":
            await asyncio.to_thread(self._process.wait, 10)
            raise first[1]
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
                self._pipe.send(("stop",))
        try:
            await asyncio.to_thread(self._process.wait, 10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        self._pipe.conn.close()
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
                case ("deltas", items):
                    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
                    for rid, item in items:
                        stream = self._streams.get(rid)
                        if stream is not None:  # else its reader has left
                            by_loop.setdefault(stream.loop, []).append((stream.out, item))
                    for loop, batch in by_loop.items():
                        with contextlib.suppress(RuntimeError):  # the loop has closed
                            loop.call_soon_threadsafe(_deliver, batch)
                case ("done", mid, error, seconds):
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
                stream.loop.call_soon_threadsafe(_deliver, [(stream.out, ended)])
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

    async def _ask(self, message: Callable[[int], tuple]) -> float:
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
                self._pipe.send(("cancel", rid))

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
            self._pipe.send(("submit", rid, request, adapter, seed))
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
                    self._pipe.send(("cancel", rid))

    def _stage(self, source: WeightSource) -> WeightSource:
        # tensors are scanned here, before they are sent; a checkpoint is read by the child
        if isinstance(source, NamedTensors) and not source.verified:
            source = scanned(NamedTensors({k: v.detach().cpu() for k, v in source.tensors.items()}))
        return source

    async def _apply_as(self, source: WeightSource, version: int) -> float:
        return await self._ask(lambda mid: ("swap", mid, source, version, self.swap_keeps))

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        await self._ask(lambda mid: ("load_adapter", mid, spec, name))

    def _unload_adapter(self, name: str) -> None:
        if not self._exited.is_set():
            with contextlib.suppress(OSError):
                self._pipe.send(("drop_adapter", name))


# -- the child ----------------------------------------------------------------------------------------
class _PipeSink:
    """The child's stand-in for the server's event loop: a hand-over of the worker goes to the parent as
    one message; a stream that ended is forgotten."""

    def __init__(self, pipe: _Pipe, running: dict[str, threading.Event]):
        self.pipe, self.running = pipe, running

    def call_soon_threadsafe(self, callback: Callable[..., Any], items: list[tuple[str, Any]]) -> None:
        for rid, item in items:
            if isinstance(item, BaseException) or item.finish_reason is not None:
                self.running.pop(rid, None)
        with contextlib.suppress(OSError):  # the parent is gone: the main loop sees the pipe end
            self.pipe.send(("deltas", [(rid, _portable(item) if isinstance(item, BaseException) else item)
                                       for rid, item in items]))


def _child_main(conn: Connection) -> None:
    # a signal to the server's process group (Ctrl-C, a supervisor's SIGTERM) reaches this process too:
    # its server stops it in order (its streams end first); if the server is gone, the pipe's end stops it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)
    pipe = _Pipe(conn)
    try:
        _, config, model_path, version, weights_path = pipe.receive()
        engine = HFEngine(config, model_path)
        asyncio.run(engine.start(version, weights_path))
    except (EOFError, OSError):  # the parent is gone
        return
    except BaseException as exc:
        pipe.send(("failed", _portable(exc)))
        return
    running: dict[str, threading.Event] = {}  # rid -> its cancelled event, while it runs
    sink = _PipeSink(pipe, running)

    def reply(mid: int) -> Callable[[BaseException | None], None]:
        def done(error: BaseException | None) -> None:
            with contextlib.suppress(OSError):
                pipe.send(("done", mid, _portable(error), engine._copy_seconds))
        return done

    def stage_then_swap(mid: int, source: WeightSource, version: int, keep: bool) -> None:
        try:
            staged = engine._stage(source)  # a checkpoint is read here, beside the worker's steps
        except BaseException as exc:
            reply(mid)(exc)
            return
        engine._inbox.put(Swap(staged, reply(mid), version, keep))

    pipe.send(("ready",))
    try:
        while True:
            if not conn.poll(0.5):
                if not engine.healthy():  # its worker stopped (a failed copy): end, so the parent knows
                    return
                continue
            try:
                message = pipe.receive()
            except (EOFError, OSError):  # the parent is gone
                return
            match message:
                case ("submit", rid, request, adapter, seed):
                    cancelled = threading.Event()
                    running[rid] = cancelled
                    job = engine._job(request, engine._emitter(sink, rid), torch.Generator().manual_seed(seed), cancelled)
                    engine._inbox.put(Submit(job, adapter))
                case ("cancel", rid):
                    if (cancelled := running.pop(rid, None)) is not None:
                        cancelled.set()
                case ("swap", mid, source, version, keep):
                    threading.Thread(target=stage_then_swap, args=(mid, source, version, keep), daemon=True).start()
                case ("load_adapter", mid, spec, name):
                    engine._inbox.put(LoadAdapter(spec, name, reply(mid)))
                case ("drop_adapter", name):
                    engine._inbox.put(DropAdapter(name))
                case ("stop",):
                    return
    finally:
        engine._closing.set()
        engine._inbox.put(Stop())
        if engine._thread is not None:
            engine._thread.join(10)


if __name__ == "__main__":
    from multiprocessing.connection import Connection as _Connection

    _child_main(_Connection(int(sys.argv[1])))
