"""`GatedEngine`: what every backend shares around its model, written once: its config, the
`VersionGate` that admits generations and drains them for a swap, the version and preemption count it
reports, and the weight swap's shape (stage the source, close the gate, drain, apply, reopen).

A backend supplies `start`, `close`, `healthy`, `_admit` (one request's preempt callback and its delta
stream) and `_apply` (load a weight source into the model; it runs with the gate closed and drained,
and must leave the old weights serving if it raises). `_stage` may bring a source into the form
`_apply` reads before the gate closes (vLLM writes named tensors to a checkpoint directory there).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from liveloop.server.engines.base import (
    Generation,
    GenerationRequest,
    Preempt,
    TokenDelta,
    VersionGate,
    WeightSource,
    weight_source,
)

if TYPE_CHECKING:
    from liveloop.server.config import EngineConfig


class GatedEngine:
    name: str

    def __init__(self, config: EngineConfig, model_path: str | Path):
        self.config = config
        self.model_path = str(model_path)
        self.max_model_len = config.max_model_len
        self._gate = VersionGate(0, config.drain_deadline_seconds)

    @property
    def version(self) -> int:
        return self._gate.version

    @property
    def swap_preempted(self) -> int:
        return self._gate.preempted

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Generation]:
        preempt, stream = self._admit(request)
        async with self._gate.reading(preempt) as version:
            yield Generation(version, stream)

    async def update_weights(self, weights: str | Path | WeightSource, version: int) -> float:
        source = self._stage(weight_source(weights))
        return await self._gate.swap(lambda: self._apply(source), version)

    # -- what a backend supplies ---------------------------------------------------------------------
    def _admit(self, request: GenerationRequest) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        """The callback that ends this generation for a swap (see `VersionGate.reading`), and its
        stream of deltas (not started yet)."""
        raise NotImplementedError

    def _stage(self, source: WeightSource) -> WeightSource:
        return source

    async def _apply(self, source: WeightSource) -> None:
        raise NotImplementedError
