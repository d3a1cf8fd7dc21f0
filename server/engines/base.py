"""The Engine protocol every backend satisfies, the typed values it speaks (requests, deltas; weight
sources are the transport layer's: `liveloop.transport.weights`), the version gate that makes swaps
atomic, and `create_engine` (the backend's row in registry.py).

    await engine.start(version, weights_path)      # load the model (and that version's checkpoint)
    async with engine.generate(request) as gen:    # admitted: gen.version is fixed for the whole response
        async for delta in gen:                     # new token ids + their behavior logprobs
            ...
    await engine.update_weights(checkpoint_dir, version)   # drains in-flight generations, swaps, resumes

Weights reach an engine through one typed seam, `WeightSource`: a `CheckpointDir` (a plain path means
one) or `NamedTensors` (tensors in this process); each backend reads every source.

Atomicity is the engine's invariant, not the backend's: `VersionGate` admits a generation only while
no swap is pending, a swap waits for every admitted generation up to the drain deadline, and ends the
stragglers through their `preempt` callbacks (finish_reason "abort"), so each response is produced by
the one version it records. A `keep` swap never closes the gate; the backend continues running
generations under the new weights, KV recomputed, each delta naming the version that sampled it.
The whole argument: docs/engines.md, "The version gate: drain and keep swaps".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from liveloop.sampling import Sampling
from liveloop.segments import BASE, Lineage
from liveloop.server.engines.registry import engine_class

if TYPE_CHECKING:
    import torch

    from liveloop.server.config import EngineConfig
    from liveloop.transport.weights import CheckpointDir, WeightSource

log = logging.getLogger(__name__)

Preempt = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. The behaviour logprob an engine records for a token is that of the
    distribution it drew from (`logprobs_of = "sampled"`: restricted to the tokens `constraint` allows,
    penalised, tempered and cut, liveloop/sampling.py) or of the raw temperature-1 one (`"raw"`); the
    record says which (`recorded`), and the learner scores the policy the same way (docs/design.md,
    "The draw and the ratio")."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per position, besides the sampled token's own logprob
    stop_token_ids: tuple[int, ...] = ()  # a sampled one ends the generation ("stop")
    top_k: int = 0  # sample among the k most likely tokens only (0: all)
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one
    repetition_penalty: float = 1.0  # vLLM's: logits of tokens in the prompt or output / (or *) this
    min_tokens: int = 0  # stop tokens cannot be sampled before this many tokens
    # an xgrammar structural tag (JSON text, liveloop.grammar) every sampled token must follow; its
    # grammar ends with a stop token. None: unconstrained
    constraint: str | None = None

    def recorded(self, logprobs_of: str) -> Sampling:
        """How a response drawn with these parameters was sampled, for its record, by an engine whose
        behaviour logprobs are `logprobs_of` ("sampled" or "raw")."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty, self.min_tokens, logprobs_of)

    def extensions(self) -> dict[str, object]:
        """The sampling options beyond temperature / top-p / seed that this request sets."""
        defaults = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0}
        return {k: getattr(self, k) for k, d in defaults.items() if getattr(self, k) != d}


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    lineage: Lineage = BASE  # whose adapter serves it (its segment's, or a candidate slot's); base: the base weights alone
    canary: bool = False  # its user is in the canary share: a canary candidate serves it when one is loaded (engines/canary.py)


@dataclass
class TokenDelta:
    """New tokens since the last delta. `logprobs[i]` is the behavior logprob of `token_ids[i]` under
    the serving version's distribution it was drawn from (`SamplingParams`: the draw's, or the raw one)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" when the generation ended
    # the version whose weights sampled these tokens (None: the generation's admitted version). A
    # `keep` swap lets a running generation continue under new weights: its later deltas name the new
    # version, and one delta never mixes versions.
    version: int | None = None
    # prompt tokens whose KV the engine's prefix cache held (its first delta says; None: not known)
    cached_tokens: int | None = None


def aborted() -> TokenDelta:
    """The last delta of a generation a swap ended: no new tokens, finish_reason "abort"."""
    return TokenDelta([], [], None, "abort")


@dataclass
class Generation:
    """An admitted generation: the version that produces it, and its stream of deltas. For a request
    with a segment whose adapter is loaded, `version` is that adapter's version and `adapter` is True;
    otherwise `version` is the base weights' version and `adapter` is False."""

    version: int
    stream: AsyncIterator[TokenDelta]
    adapter: bool = False

    def __aiter__(self) -> AsyncIterator[TokenDelta]:
        return self.stream


@runtime_checkable
class Engine(Protocol):
    """A token-id machine serving one policy version at a time (`create_engine` builds one)."""

    name: str
    max_model_len: int

    @property
    def version(self) -> int:
        """The version new generations are admitted under."""
        ...

    @property
    def swap_preempted(self) -> int:
        """Generations that swaps have ended at their drain deadline, since start."""
        ...

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        """Load the model, then the checkpoint directory `weights_path` if given, and serve it as
        `version`."""
        ...

    async def close(self) -> None: ...

    def healthy(self) -> bool:
        """Whether the engine can generate now (for /healthz); must not block."""
        ...

    def generate(self, request: GenerationRequest) -> contextlib.AbstractAsyncContextManager[Generation]: ...

    async def update_weights(self, weights: str | Path | WeightSource, version: int) -> float:
        """Swap in new weights as `version` (a path is a `CheckpointDir`); returns seconds new requests
        were held back (a drain swap: the drain and the load; a keep swap: only what the backend's
        own load held them, e.g. vLLM's pause). Generations still running at the drain deadline are
        ended (finish_reason "abort") before the new weights are applied. If the weights cannot be
        loaded it raises and the old version keeps serving, its weights intact."""
        ...

    supports_adapters: bool  # whether update_adapter can serve LoRA adapters (config.max_adapters > 0)
    supports_constraints: bool  # whether it samples under `SamplingParams.constraint` (constrained decoding)
    sampling_extensions: frozenset[str]  # the `SamplingParams.extensions()` it honours
    # what its behaviour logprobs are of: "sampled" (the distribution each draw used, liveloop.sampling)
    # or "raw" (the temperature-1 one, uncut, whatever the draw's shaping)
    logprobs_of: str

    def adapter_version(self, segment: str) -> int | None:
        """The adapter version new requests of `segment` are served with; None: the base weights."""
        ...

    async def update_adapter(self, segment: str, adapter: CheckpointDir | None, version: int) -> float:
        """Serve the LoRA adapter in `adapter` (a peft `save_pretrained` directory) to `segment`'s new
        requests as `version`; None serves them the base weights again. Generations already running keep
        the adapter they started with until they finish (each response is produced by one version), and
        other segments are not touched. Returns seconds `segment`'s new requests were held back. If the
        adapter cannot be loaded it raises `AdapterUnusable` and the old one keeps serving."""
        ...


class AdaptersUnsupported(RuntimeError):
    """The engine was not started with adapter support (engine.max_adapters = 0) or its backend has none."""


class AdapterUnusable(ValueError):
    """An adapter directory the engine could not load (the segment's old adapter keeps serving)."""


class EngineUnavailable(RuntimeError):
    """The engine cannot take the request now: a remote engine (an SGLang server) did not answer. The
    client may retry (503)."""


@dataclass(eq=False)
class _Reader:
    preempt: Preempt | None


class VersionGate:
    """Readers are generations, the writer is a weight swap; writer-preferring so swaps never starve.

    A swap waits up to `drain_deadline` seconds (None: for ever) for the admitted generations, then
    ends the remaining ones through their `preempt` callbacks and stops counting them, so their own
    exit later changes nothing. A reader without a callback cannot be ended: the swap waits for it."""

    def __init__(self, version: int = 0, drain_deadline: float | None = None):
        self.version = version
        self.drain_deadline = drain_deadline
        self.preempted = 0  # generations ended by swaps, all swaps together
        self._cond = asyncio.Condition()
        self._readers: set[_Reader] = set()
        self._swap_pending = False
        self._swapping = asyncio.Lock()  # one swap at a time, keep or drain

    @property
    def active(self) -> int:
        return len(self._readers)

    @contextlib.asynccontextmanager
    async def reading(self, preempt: Preempt | None = None) -> AsyncIterator[int]:
        """Admit one generation; yields the version it is produced by. `preempt` must stop it in the
        engine at a token boundary (its stream then ends with finish_reason "abort") and return only
        once no token of it can be computed by weights a later `apply` loads; it may be called on a
        generation that has just finished, and must then do nothing harmful."""
        reader = _Reader(preempt)
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swap_pending)
            self._readers.add(reader)
            version = self.version
        try:
            yield version
        finally:
            async with self._cond:
                self._readers.discard(reader)  # a preempted reader is already gone
                self._cond.notify_all()

    async def swap(self, apply: Callable[[], Awaitable[float | None]], version: int, drain: bool = True) -> float:
        """Close to new generations, drain in-flight ones (ending those left at the deadline), run
        `apply`, set `version`, reopen. Returns the seconds new generations were held back. If `apply`
        (or a preemption) fails the old version stays. `drain=False` (a keep swap) never closes the
        gate: admitted generations go on and new ones are admitted (under the old version) while
        `apply` runs; it returns what `apply` returns (the seconds the backend's own load held new
        generations back, None: none). Swaps run one at a time."""
        if not drain:
            async with self._swapping:
                held = await apply()
                self.version = version
            return held or 0.0
        loop = asyncio.get_running_loop()
        async with self._swapping, self._cond:
            self._swap_pending = True
            closed_at = loop.time()
            try:
                await self._drain(version)
                await apply()
                self.version = version
            finally:
                self._swap_pending = False
                self._cond.notify_all()
        return loop.time() - closed_at

    async def _drain(self, version: int) -> None:
        """With the lock held: return once no reader is counted."""
        if self.drain_deadline is None:
            await self._cond.wait_for(lambda: not self._readers)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.drain_deadline):
                await self._cond.wait_for(lambda: not self._readers)
        stragglers = [r for r in self._readers if r.preempt is not None]
        if stragglers:
            results = await asyncio.gather(*(r.preempt() for r in stragglers), return_exceptions=True)
            ended = [r for r, res in zip(stragglers, results) if not isinstance(res, BaseException)]
            self._readers.difference_update(ended)
            self.preempted += len(ended)
            log.warning(
                "swap to version %d: %d generation(s) still running after the %g s drain deadline were "
                "ended (finish_reason 'abort')", version, len(ended), self.drain_deadline,
            )
            failed = [res for res in results if isinstance(res, BaseException)]
            if failed:
                raise failed[0]
        await self._cond.wait_for(lambda: not self._readers)


def create_engine(config: EngineConfig, model_path: str | Path) -> Engine:
    """Instantiate the backend named by `config.backend` on `config.hf_worker` (its row in
    server/engines/registry.py; its module is imported here, so vllm is imported only where it serves)."""
    return engine_class(config.backend, config.hf_worker)(config, model_path)
