"""The Engine protocol, the typed messages it speaks, the drain gate that makes swaps atomic, and the
backend registry.

    async with engine.generate(request) as gen:   # admitted: gen.version is fixed for the whole response
        async for delta in gen:                    # new token ids + their behavior logprobs
            ...
    await engine.update_weights(tensors_or_dir, version)   # waits for in-flight generations, swaps, resumes

Atomicity is the engine's invariant, not the backend's: `VersionGate` admits a generation only while
no swap is pending, and a swap waits until every admitted generation has finished. So each response
is produced entirely by one version and records it, and new weights never continue a KV cache that
old weights computed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from liveloop.server.config import EngineConfig

@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per position, besides the sampled token's own logprob
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams


@dataclass
class TokenDelta:
    """New tokens since the last delta. `logprobs[i]` is the behavior logprob of `token_ids[i]` under
    the raw (temperature-1, unfiltered) distribution of the serving version."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" when the generation ended


@dataclass
class Generation:
    """An admitted generation: the version that produces it, and its stream of deltas."""

    version: int
    stream: AsyncIterator[TokenDelta]

    def __aiter__(self) -> AsyncIterator[TokenDelta]:
        return self.stream


class Engine(Protocol):
    name: str
    max_model_len: int

    @property
    def version(self) -> int: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def generate(self, request: GenerationRequest) -> contextlib.AbstractAsyncContextManager[Generation]: ...

    async def update_weights(self, weights: Any, version: int) -> float:
        """Swap in new weights (named tensors or a checkpoint directory) as `version`; returns seconds
        the engine was closed to new requests."""
        ...


class VersionGate:
    """Readers are generations, the writer is a weight swap; writer-preferring so swaps never starve."""

    def __init__(self, version: int = 0):
        self.version = version
        self._cond = asyncio.Condition()
        self._active = 0
        self._swap_pending = False

    @property
    def active(self) -> int:
        return self._active

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[int]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swap_pending)
            self._active += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    async def swap(self, apply: Callable[[], Awaitable[None]], version: int) -> float:
        """Close to new generations, wait for in-flight ones, run `apply`, set `version`, reopen.
        Returns the seconds new generations were held back. If `apply` fails the old version stays."""
        loop = asyncio.get_running_loop()
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swap_pending)
            self._swap_pending = True
            closed_at = loop.time()
            try:
                await self._cond.wait_for(lambda: self._active == 0)
                await apply()
                self.version = version
            finally:
                self._swap_pending = False
                self._cond.notify_all()
        return loop.time() - closed_at


def create_engine(config: "EngineConfig", model_path: str | Path) -> Engine:
    """Instantiate the backend named by `config.backend` (`vllm`, `hf`)."""
    # Import backends lazily: `vllm` must not be imported where it is not used.
    if config.backend == "vllm":
        from liveloop.server.engines.vllm_engine import VLLMEngine

        return VLLMEngine(config, model_path)
    if config.backend == "hf":
        from liveloop.server.engines.hf_engine import HFEngine

        return HFEngine(config, model_path)
    if config.backend == "diffusion":
        from liveloop.server.engines.diffusion_engine import DiffusionEngine

        return DiffusionEngine(config, model_path)
    raise ValueError(f"engine.backend: unknown backend {config.backend!r} (vllm, hf, diffusion)")
