"""`GatedEngine`: what every backend shares around its model, written once: its config, the
`VersionGate` that admits generations and drains them for a swap, the version and preemption count it
reports, the weight swap's shape (stage the source; then close the gate, drain, apply, reopen, or for a
keep swap apply alone), and the per-segment LoRA adapters' bookkeeping (`adapters.AdapterTable`).

A backend supplies `start`, `close`, `healthy`, `_admit` (one request's preempt callback and its delta
stream) and `_apply` (load a weight source into the model; in drain mode with the gate closed and
drained; it must leave the old weights serving if it raises). `_stage` brings a source into the form
`_apply` reads, in a thread, before anything is closed or paused: the swap's critical section is the
load alone.

Adapters: a backend that serves them sets `supports_adapters` (from `config.max_adapters > 0`), takes
the adapter's name in `_admit(request, adapter)`, and supplies `_load_adapter` and `_unload_adapter`.
An adapter swap goes around the gate: the segment's entry is repointed once the new adapter is loaded,
and each generation keeps the adapter it was admitted with. `move_adapter` hands one key's adapter to
another (the release gate promoting a candidate). Keep swaps: a backend that can continue running
generations under new weights sets `keeps_generations` and reads the target version in `_apply_as`;
on one without it a keep swap drains. Details: docs/engines.md, "Gated engines".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from liveloop.server.engines.adapters import AdapterSpec, AdapterTable, Lease, read_adapter
from liveloop.server.engines.base import (
    AdaptersUnsupported,
    Generation,
    GenerationRequest,
    Preempt,
    TokenDelta,
    VersionGate,
)
from liveloop.transport.weights import CheckpointDir, WeightSource, weight_source

if TYPE_CHECKING:
    from liveloop.server.config import EngineConfig

log = logging.getLogger(__name__)


class GatedEngine:
    name: str
    supports_adapters: bool = False  # a backend that serves adapters sets it from config.max_adapters
    keeps_generations: bool = False  # a backend whose running generations survive a swap (swap_mode keep)
    supports_constraints: bool = False  # a backend that samples under a grammar (SamplingParams.constraint)
    sampling_extensions: frozenset[str] = frozenset()  # the SamplingParams.extensions() it honours
    logprobs_of: str = "raw"  # "sampled": a backend that logs the draw's own distribution (liveloop.sampling)

    def __init__(self, config: EngineConfig, model_path: str | Path):
        self.config = config
        self.model_path = str(model_path)
        self.max_model_len = config.max_model_len
        self._gate = VersionGate(0, config.drain_deadline_seconds)
        self._adapters = AdapterTable(config.max_adapters)
        self._adapter_updates = asyncio.Lock()  # one adapter load at a time: the room check holds
        self.swap_keeps = config.swap_mode == "keep" and self.keeps_generations
        if config.swap_mode == "keep" and not self.keeps_generations:
            log.warning("%s engine: swap_mode 'keep' is not supported by this backend; swaps drain", self.name)

    @property
    def version(self) -> int:
        return self._gate.version

    @property
    def swap_preempted(self) -> int:
        return self._gate.preempted

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Generation]:
        # The adapter is chosen when the request arrives: one that waits for a weight swap keeps it
        # (still loaded, as it is counted) and records its version.
        lease = self._adapters.acquire(request.lineage) if self.supports_adapters else None
        try:
            preempt, stream = self._admit(request) if lease is None else self._admit(request, lease.name)
            async with self._gate.reading(preempt) as version:
                if lease is None:
                    yield Generation(version, stream)
                else:
                    yield Generation(lease.version, stream, adapter=True)
        finally:
            if lease is not None:
                self._release(lease)

    async def update_weights(self, weights: str | Path | WeightSource, version: int) -> float:
        # staged off the event loop and before anything closes: reading a checkpoint, scanning values or
        # packing tensors holds back no request
        source = await asyncio.to_thread(self._stage, weight_source(weights))
        return await self._gate.swap(lambda: self._apply_as(source, version), version, drain=not self.swap_keeps)

    def adapter_version(self, segment: str) -> int | None:
        lease = self._adapters.current(segment)
        return None if lease is None else lease.version

    async def update_adapter(self, segment: str, adapter: CheckpointDir | None, version: int) -> float:
        if not self.supports_adapters:
            raise AdaptersUnsupported(
                f"{self.name} engine: no adapter support (engine.max_adapters = {self.config.max_adapters}"
                f"{'' if self.config.max_adapters else '; set it above 0'})"
            )
        if adapter is not None and not isinstance(adapter, CheckpointDir):
            raise TypeError(f"update_adapter: expected a CheckpointDir or None, got {type(adapter).__name__}")
        async with self._adapter_updates:
            if adapter is None:
                self._unload_if(self._adapters.point(segment, None))
                return 0.0
            spec = read_adapter(Path(adapter.path), self.config.max_lora_rank)
            self._adapters.check_room(segment)
            name = self._adapters.new_name()
            try:
                await self._load_adapter(name, spec)
            except asyncio.CancelledError:  # the load may still complete: never leave it loaded unnamed
                self._unload_adapter(name)
                raise
            self._unload_if(self._adapters.point(segment, Lease(version, name)))
        # the segment's new requests were never held: the old adapter served them until the repoint
        return 0.0

    async def move_adapter(self, source: str, target: str) -> int:
        """Serve `target`'s new requests with the adapter loaded under `source` (a candidate slot), with
        no load: `source` then names none, running generations keep the adapter they started with, and
        `target`'s old adapter is unloaded once none runs on it. Returns the moved adapter's version.
        Raises LookupError (nothing changed) if `source` holds no adapter."""
        async with self._adapter_updates:
            lease = self._adapters.current(source)
            if lease is None:
                raise LookupError(f"{self.name} engine: no adapter is loaded under {source!r}")
            self._unload_if(self._adapters.move(source, target))
            return lease.version

    def _release(self, lease: Lease) -> None:
        if self._adapters.release(lease):
            self._unload_adapter(lease.name)

    def _unload_if(self, name: str | None) -> None:
        if name is not None:
            self._unload_adapter(name)

    # -- what a backend supplies ---------------------------------------------------------------------
    def _admit(self, request: GenerationRequest, adapter: str | None = None) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        """The callback that ends this generation for a swap (see `VersionGate.reading`), and its
        stream of deltas (not started yet), served with the loaded adapter `adapter` (None: the base
        weights)."""
        raise NotImplementedError

    def _stage(self, source: WeightSource) -> WeightSource:
        return source

    async def _apply(self, source: WeightSource) -> float | None:
        raise NotImplementedError

    async def _apply_as(self, source: WeightSource, version: int) -> float | None:
        """`_apply` for a backend that must know the version it swaps to (one that keeps generations
        running across the swap names it on their later deltas). Returns the seconds the load held new
        generations back (None: not measured; a keep swap then reports 0)."""
        return await self._apply(source)

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        """Load the adapter `spec` describes under `name`, or raise AdapterUnusable with the engine's
        other adapters untouched."""
        raise NotImplementedError

    def _unload_adapter(self, name: str) -> None:
        """Unload adapter `name`: no generation runs on it any more (must not block)."""
        raise NotImplementedError
