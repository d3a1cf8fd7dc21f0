"""The scaffolding of an engine whose model lives on ONE worker thread (the `hf` and `diffusion`
backends): the inbox the thread reads, holding typed messages (`Submit` a request, `Swap` the weights,
`LoadAdapter` / `DropAdapter` a LoRA adapter, `Stop`), the bridge that turns a request's deltas from
the thread into an async stream, per-request seeded generators, and the weight swap.

A swap's weights are staged off the worker and off the event loop (`_stage`: a checkpoint read, values
not known finite scanned); the worker then checks names and shapes and copies in place. A copy that
fails anyway (a fault of the machine) stops the engine rather than serve a half-old model. A swap that
ends a straggler sets its job's `cancelled` event before it queues its `Swap`, so the worker never
computes a token of it under the new weights.

The worker's public interface (`submit`, `stage`, `post_swap`, `post_load_adapter`,
`post_drop_adapter`, `copy_seconds`, `stop_worker`) drives it from outside an event loop: the hf
engine's own process (hf/child.py). A backend supplies `start` (load the model, then
`_start_worker`), `_job`, `_run` (the worker loop), `_weights_module` and `_read_checkpoint`; what each
must do: docs/engines.md, "Threaded engines".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import (
    GenerationRequest,
    Preempt,
    TokenDelta,
    aborted,
)
from liveloop.transport.weights import CheckpointDir, NamedTensors, WeightSource
from liveloop.server.engines.gated import GatedEngine
from liveloop.transport.weights import check_state, copy_state, scanned

if TYPE_CHECKING:
    from liveloop.server.config import EngineConfig

log = logging.getLogger(__name__)

Emit = Callable[[TokenDelta | BaseException], None]
Done = Callable[[BaseException | None], None]  # the worker reports a message's outcome: None or the error
Job = TypeVar("Job")


@dataclass(frozen=True)
class Submit(Generic[Job]):
    """A request to generate: the backend's per-request state, and the loaded adapter that serves it
    (None: the base weights)."""

    job: Job
    adapter: str | None = None


@dataclass(frozen=True)
class Swap:
    """Load `source` into the model as `version`; `done` reports the outcome (None or the error) to
    the waiting swap, from the worker thread. `keep`: the gate did not drain, so the worker continues
    the jobs it holds under the new weights (a backend without keep support never receives it)."""

    source: WeightSource
    done: Done
    version: int | None = None
    keep: bool = False


@dataclass(frozen=True)
class LoadAdapter:
    """Load the (checked) adapter `spec` under `name`; `done` reports the outcome like `Swap`'s."""

    spec: AdapterSpec
    name: str
    done: Done


@dataclass(frozen=True)
class DropAdapter:
    """Unload adapter `name`: no admitted generation runs on it any more."""

    name: str


@dataclass(frozen=True)
class Stop:
    """End the worker loop (the engine is closing)."""


Message = Submit[Any] | Swap | LoadAdapter | DropAdapter | Stop


class HasState(Protocol):
    """What a swap reads and writes: a module, or a view of the weights a module serves."""

    def state_dict(self) -> Mapping[str, torch.Tensor]: ...


class ThreadedEngine(GatedEngine):
    thread_name = "liveloop-engine"

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._seed_source = torch.Generator().manual_seed(config.seed)
        self._serving_version = 0  # the worker's: the version of the weights its model holds now
        self._copy_seconds = 0.0  # the worker's: how long the last swap's copy held its steps
        self._streams: set[Emit] = set()  # every live stream's emit (a broken engine ends them all)
        # the worker's: deltas emitted inside `_one_handover`, and those carried over to a later one
        self._held: list[_Held] | None = None
        self._carried: list[_Held] = []
        self._delta_interval = config.delta_interval_ms / 1000
        self._last_handover = 0.0

    def healthy(self) -> bool:
        """The worker thread that owns the model is running (it never blocks)."""
        return self._thread is not None and self._thread.is_alive() and not self._closing.is_set()

    def _start_worker(self, version: int) -> None:
        self._gate.version = version
        self._serving_version = version
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    async def close(self) -> None:
        self._request_stop()
        if self._thread:
            await asyncio.to_thread(self._thread.join, 10)

    def _admit(self, request: GenerationRequest, adapter: str | None = None) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        cancelled = threading.Event()

        async def preempt() -> None:
            # the swap is queued on the inbox after this: the worker sees the flag before it runs
            cancelled.set()

        return preempt, self._stream(request, cancelled, adapter)

    async def _stream(self, request: GenerationRequest, cancelled: threading.Event, adapter: str | None) -> AsyncIterator[TokenDelta]:
        if cancelled.is_set():  # ended by a swap before it started: nothing to generate
            yield aborted()
            return
        out: asyncio.Queue = asyncio.Queue()
        emit = self._emitter(asyncio.get_running_loop(), out)
        seed = request_seed(request, self._seed_source)
        if not self.healthy():
            raise RuntimeError(f"{self.name} engine is not running (not started, closed, or broken by a failed copy)")
        self._streams.add(emit)
        self._submit_job(request, emit, seed, adapter, cancelled)
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
            self._streams.discard(emit)
            cancelled.set()

    # -- the worker driven from outside an event loop (the hf engine's own process: hf/child.py) ------
    def submit(self, request: GenerationRequest, seed: int, adapter: str | None, sink: Sink, key: Any,
               cancelled: threading.Event) -> None:
        """Queue `request` on the worker, sampling with `seed`, served with the loaded adapter `adapter`;
        its deltas go to `sink` as `(key, delta)` items, one call per hand-over. Setting `cancelled`
        ends it at the next token boundary."""
        self._submit_job(request, self._emitter(sink, key), seed, adapter, cancelled)

    def stage(self, source: WeightSource) -> WeightSource:
        """`source` in the form the worker loads (a checkpoint read, values scanned), in the caller's thread."""
        return self._stage(source)

    def post_swap(self, staged: WeightSource, version: int, keep: bool, done: Done) -> None:
        """Queue a swap to the `stage`d weights as `version`; `done` reports its outcome from the worker."""
        self._inbox.put(Swap(staged, done, version, keep))

    def post_load_adapter(self, spec: AdapterSpec, name: str, done: Done) -> None:
        """Queue loading the checked adapter `spec` under `name`; `done` reports its outcome from the worker."""
        self._inbox.put(LoadAdapter(spec, name, done))

    def post_drop_adapter(self, name: str) -> None:
        """Queue unloading adapter `name` (no generation runs on it any more)."""
        self._inbox.put(DropAdapter(name))

    @property
    def copy_seconds(self) -> float:
        """How long the last swap's copy held the worker's steps."""
        return self._copy_seconds

    def stop_worker(self, timeout: float = 10.0) -> None:
        """End the worker loop and wait up to `timeout` seconds for its thread (blocks)."""
        self._request_stop()
        if self._thread:
            self._thread.join(timeout)

    def _request_stop(self) -> None:
        self._closing.set()
        self._inbox.put(Stop())

    def _submit_job(self, request: GenerationRequest, emit: Emit, seed: int, adapter: str | None,
                    cancelled: threading.Event) -> None:
        self._inbox.put(Submit(self._job(request, emit, torch.Generator().manual_seed(seed), cancelled), adapter))

    def _emitter(self, loop: Sink, out: Any) -> Emit:
        """How the worker emits a stream's deltas: into `out` (an asyncio.Queue) on `loop`, through
        `_one_handover` when it emits inside one. `loop` may be any `Sink`: what the hf engine's own
        process hands its deltas to (hf/child.py)."""
        first = True

        def emit(item: TokenDelta | BaseException) -> None:
            nonlocal first
            held = self._held
            if held is not None and threading.current_thread() is self._thread:
                # handed over with the rest of the worker's step; the first and the last at once
                urgent = first or isinstance(item, BaseException) or item.finish_reason is not None
                held.append(_Held(loop, out, item, urgent))
            else:
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any more
                    loop.call_soon_threadsafe(deliver, [(out, item)])
            first = False

        return emit

    @contextlib.contextmanager
    def _one_handover(self) -> Iterator[None]:
        """On the worker: what is emitted inside reaches its streams when the block ends, in one
        hand-over per event loop (one wake-up of the loop per step, not one per token of every row),
        each stream's deltas in the order they were emitted and merged into one where they can be.

        A stream's first delta, its last, and an error go at once (with the rest of that stream's);
        other tokens are carried to a later hand-over until `engine.delta_interval_ms` has passed since
        the last full one: the server's per-token work, which on a small model takes the interpreter
        from the engine's steps, is done once per interval for each stream instead of once per token."""
        self._held = []
        failed = True
        try:
            yield
            failed = False
        finally:
            held, self._held = self._carried + self._held, None
            now = time.monotonic()
            if failed or now - self._last_handover >= self._delta_interval:
                self._carried, due = [], held
                self._last_handover = now
            else:
                urgent = {id(h.out) for h in held if h.urgent}
                due = [h for h in held if id(h.out) in urgent]
                self._carried = [h for h in held if id(h.out) not in urgent]
            _hand_over(due)

    def _hand_over_carried(self) -> None:
        """On the worker, before it waits for work: every carried delta goes now."""
        carried, self._carried = self._carried, []
        _hand_over(carried)

    def _stage(self, source: WeightSource) -> WeightSource:
        # in a thread, before the swap reaches the worker: generation goes on while a checkpoint is
        # read and values are scanned, and the worker only checks names and shapes and copies
        if isinstance(source, CheckpointDir):
            source = NamedTensors(self._read_checkpoint(source.path))
        if isinstance(source, NamedTensors) and not source.verified:
            source = scanned(source)
        return source

    async def _apply_as(self, source: WeightSource, version: int) -> float:
        await self._on_worker(lambda report: Swap(source, report, version, self.swap_keeps))
        return self._copy_seconds

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        await self._on_worker(lambda report: LoadAdapter(spec, name, report))

    def _unload_adapter(self, name: str) -> None:
        self.post_drop_adapter(name)

    async def _on_worker(self, message: Callable[[Done], Message]) -> None:
        """Queue the message `message(report)` builds and wait until the worker reports its outcome."""
        if not self.healthy():  # no worker would ever answer
            raise RuntimeError(f"{self.name} engine is not running (not started, or closed)")
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self._inbox.put(message(lambda error: loop.call_soon_threadsafe(_settle, done, error)))
        await done

    def _swap(self, swap: Swap) -> bool:
        """On the worker thread: load the swap's weights. Weights that fail the checks are refused
        (reported to the swap; the old ones keep serving, untouched, and so do caches they computed).
        Returns whether the new weights serve now."""
        module = self._weights_module()
        try:
            state, verified = self._read_state(swap.source)
            check_state(module, state, finite=not verified)
        except BaseException as exc:
            swap.done(exc)
            return False
        started = time.perf_counter()
        try:
            copy_state(module, state)
        except BaseException as exc:
            # checked, so only a fault of the machine gets here: never serve a model half old, half new
            log.critical("%s engine: copying checked weights failed part-way; the engine stops", self.name, exc_info=True)
            self._closing.set()
            for emit in list(self._streams):
                emit(exc)
            swap.done(exc)
            raise
        self._copy_seconds = time.perf_counter() - started
        if swap.version is not None:
            self._serving_version = swap.version
        swap.done(None)
        return True

    def _read_state(self, source: WeightSource) -> tuple[Mapping[str, torch.Tensor], bool]:
        """The tensors to copy, and whether their values are known finite."""
        staged = self._stage(source)  # `update_weights` staged it already: a checkpoint arrives as tensors
        if not isinstance(staged, NamedTensors):
            raise TypeError(f"{self.name} engine: cannot load weights from {type(source).__name__}")
        return staged.tensors, staged.verified

    # -- what a backend supplies ---------------------------------------------------------------------
    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> Any:
        raise NotImplementedError

    def _run(self) -> None:
        raise NotImplementedError

    def _weights_module(self) -> HasState:
        raise NotImplementedError

    def _read_checkpoint(self, path: Path) -> Mapping[str, torch.Tensor]:
        raise NotImplementedError


class Sink(Protocol):
    """Where the worker hands deltas: an event loop, or anything that takes `call_soon_threadsafe(
    deliver, [(out, item), ...])` the same way."""

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> Any: ...


@dataclass(frozen=True)
class _Held:
    """A delta emitted on the worker, waiting for its hand-over to the event loop of its stream."""

    loop: Sink
    out: Any  # the stream's asyncio.Queue (or what a Sink knows the stream by)
    item: TokenDelta | BaseException
    urgent: bool


def request_seed(request: GenerationRequest, source: torch.Generator) -> int:
    """The seed a request samples with: its own, else the next drawn from the engine's `engine.seed`
    generator (the thread engine and the hf engine's own process draw alike: the same tokens)."""
    if request.sampling.seed is not None:
        return request.sampling.seed
    return int(torch.randint(0, 2**31 - 1, (1,), generator=source))


def _hand_over(held: list[_Held]) -> None:
    """Queue `held` on their streams, one call into each event loop, consecutive deltas of a stream merged."""
    by_loop: dict[Sink, list[tuple[Any, TokenDelta | BaseException]]] = {}
    last: dict[int, int] = {}  # a stream's (its out's id) latest place in its loop's items
    for h in held:
        items = by_loop.setdefault(h.loop, [])
        i = last.get(id(h.out))
        merged = _merged(items[i][1], h.item) if i is not None else None
        if merged is not None:
            items[i] = (h.out, merged)
        else:
            last[id(h.out)] = len(items)
            items.append((h.out, h.item))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any more
            loop.call_soon_threadsafe(deliver, items)


def _merged(a: TokenDelta | BaseException, b: TokenDelta | BaseException) -> TokenDelta | None:
    """`a` then `b` as one delta, or None where they must stay two: an error, an ended stream, two versions."""
    if isinstance(a, BaseException) or isinstance(b, BaseException) or a.finish_reason is not None:
        return None
    if a.version != b.version or (a.top_logprobs is None) != (b.top_logprobs is None):
        return None
    top = None if a.top_logprobs is None else a.top_logprobs + b.top_logprobs
    return TokenDelta(a.token_ids + b.token_ids, a.logprobs + b.logprobs, top, b.finish_reason, b.version)


def deliver(items: list[tuple[asyncio.Queue, TokenDelta | BaseException]]) -> None:
    """Put each item on its stream's queue (called on the stream's event loop)."""
    for out, item in items:
        out.put_nowait(item)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # its waiter was cancelled: nobody reads the outcome
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
