"""`CanaryEngine`: the live engine and a second engine of the same backend for the candidate the release
gate is trying (server/control/gate.py), behind the one `Engine` protocol the rest of the server speaks.

Everything of the protocol goes to the live engine (its version, swaps, adapters, health), except that a
request marked `canary` (its user is in the canary share, release/routing.py) is served by the
candidate engine while a candidate is loaded there; its response records the candidate's version.

- `load_candidate(weights, version)` loads a version into the second engine (created at the first
  candidate, or by `prepare`), once no generation runs on it any more (else `CandidateBusy`): a user
  outside the canary never gets a candidate's token.
- `promote()` makes the candidate engine the live one at once (no second load), and the old live engine
  the slot of the next candidate; `drop_candidate()` stops routing to the candidate.
- `candidate` is the candidate engine (for the evaluation), `live` the live one.

Segment candidates are served by the live engine, from a second adapter slot,
`candidate_slot(segment)`; `load_candidate_adapter`, `drop_candidate_adapter` and `promote_adapter`
(no load) fill, empty and promote it. The reasons and the details: docs/engines.md, "The canary engine".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from liveloop.segments import Lineage
from liveloop.server.engines.base import AdaptersUnsupported, Engine, Generation, GenerationRequest

if TYPE_CHECKING:
    from liveloop.transport.weights import CheckpointDir, WeightSource

log = logging.getLogger(__name__)


SLOT_SUFFIX = "@candidate"


def candidate_slot(segment: str) -> str:
    """The adapter-table key of `segment`'s candidate adapter in the live engine."""
    return segment + SLOT_SUFFIX


class NoCandidate(RuntimeError):
    """`promote` without a loaded candidate."""


class CandidateBusy(RuntimeError):
    """The candidate engine still runs generations after the wait: nothing was loaded."""


class CanaryEngine:
    def __init__(self, live: Engine, make_engine: Callable[[], Engine], idle_seconds: float = 30.0):
        self._live = live
        self._make_engine = make_engine  # a fresh engine of the live one's backend and config
        self._spare: Engine | None = None  # the candidate's engine (None until the first candidate)
        self._candidate_version: int | None = None
        self._running: dict[int, int] = {}  # id(engine) -> generations admitted through this wrapper
        self._idle = asyncio.Condition()
        self._loading = asyncio.Lock()
        self.idle_seconds = idle_seconds

    # -- the Engine protocol: the live engine's ------------------------------------------------------
    @property
    def name(self) -> str:
        return self._live.name

    @property
    def max_model_len(self) -> int:
        return self._live.max_model_len

    @property
    def supports_adapters(self) -> bool:
        return self._live.supports_adapters

    @property
    def supports_constraints(self) -> bool:
        return self._live.supports_constraints

    @property
    def sampling_extensions(self) -> frozenset[str]:
        return self._live.sampling_extensions

    @property
    def logprobs_of(self) -> str:
        return self._live.logprobs_of

    @property
    def version(self) -> int:
        return self._live.version

    @property
    def swap_preempted(self) -> int:
        return self._live.swap_preempted + (self._spare.swap_preempted if self._spare is not None else 0)

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        await self._live.start(version, weights_path)

    async def close(self) -> None:
        self._candidate_version = None
        try:
            await self._live.close()
        finally:
            if self._spare is not None:
                await self._spare.close()

    def healthy(self) -> bool:
        return self._live.healthy()

    def adapter_version(self, segment: str) -> int | None:
        return self._live.adapter_version(segment)

    async def update_adapter(self, segment: str, adapter: CheckpointDir | None, version: int) -> float:
        return await self._live.update_adapter(segment, adapter, version)

    async def update_weights(self, weights: str | Path | WeightSource, version: int) -> float:
        return await self._live.update_weights(weights, version)

    @contextlib.asynccontextmanager
    async def generate(self, request: GenerationRequest) -> AsyncIterator[Generation]:
        # routed and counted before the first await: a load that starts later waits for this generation
        engine, request = self._route(request)
        key = id(engine)
        self._running[key] = self._running.get(key, 0) + 1
        try:
            async with engine.generate(request) as gen:
                yield gen
        finally:
            self._running[key] -= 1
            async with self._idle:
                self._idle.notify_all()

    def _route(self, request: GenerationRequest) -> tuple[Engine, GenerationRequest]:
        if not request.lineage.is_base:
            slot = candidate_slot(request.lineage.segment)
            if request.canary and self._live.supports_adapters and self._live.adapter_version(slot) is not None:
                return self._live, dataclasses.replace(request, lineage=Lineage(slot))
            return self._live, request
        spare = self._spare
        if request.canary and self._candidate_version is not None and spare is not None and spare.healthy():
            return spare, request
        return self._live, request

    # -- the candidate -------------------------------------------------------------------------------
    @property
    def live(self) -> Engine:
        return self._live

    @property
    def candidate(self) -> Engine | None:
        """The engine serving the candidate (None: no candidate loaded)."""
        return self._spare if self._candidate_version is not None else None

    @property
    def candidate_version(self) -> int | None:
        return self._candidate_version

    def routed(self, engine: Engine) -> int:
        """Generations running on `engine` that came through this wrapper."""
        return self._running.get(id(engine), 0)

    async def prepare(self) -> None:
        """Create and start the candidate engine if it is not yet (the gate calls it before it takes the
        activator's lock, so activations never wait for an engine's start)."""
        async with self._loading:
            if self._spare is None:
                spare = self._make_engine()
                await spare.start(version=self._live.version)
                self._spare = spare

    async def load_candidate(self, weights: str | Path | WeightSource, version: int) -> float:
        """Serve `version` to canary requests from the candidate engine (see the module docstring);
        returns the load's seconds. Raises CandidateBusy (nothing loaded) or the engine's load error
        (no candidate loaded then)."""
        async with self._loading:
            self._candidate_version = None  # new canary requests go to the live engine meanwhile
            loop = asyncio.get_running_loop()
            start = loop.time()
            if self._spare is None:
                spare = self._make_engine()
                await spare.start(version=version)
                self._spare = spare
            else:
                await self._wait_idle(self._spare)
            await self._spare.update_weights(weights, version)
            self._candidate_version = version
            return loop.time() - start

    async def _wait_idle(self, engine: Engine) -> None:
        try:
            async with asyncio.timeout(self.idle_seconds), self._idle:
                await self._idle.wait_for(lambda: self.routed(engine) == 0)
        except TimeoutError:
            raise CandidateBusy(
                f"{self.routed(engine)} generation(s) still run on the candidate engine after {self.idle_seconds:g} s"
            ) from None

    def drop_candidate(self) -> int | None:
        """Stop serving the candidate (its running responses finish); returns its version."""
        version, self._candidate_version = self._candidate_version, None
        return version

    def promote(self) -> int:
        """The candidate engine becomes the live one, at once; the old live engine is the next
        candidate's slot. Returns the promoted version. Raises NoCandidate."""
        if self._candidate_version is None or self._spare is None:
            raise NoCandidate("no candidate is loaded")
        version = self._candidate_version
        self._live, self._spare = self._spare, self._live
        self._candidate_version = None
        log.info("candidate version %d promoted: it serves every user", version)
        return version

    def demote(self, version: int) -> None:
        """Undo `promote` (the store refused the promotion): the old live engine serves everyone again
        and `version` is the candidate once more."""
        self._live, self._spare = self._spare, self._live
        self._candidate_version = version

    # -- segment candidates: adapter slots in the live engine ----------------------------------------
    def candidate_adapter_version(self, segment: str) -> int | None:
        """The version in `segment`'s candidate slot (None: empty)."""
        if not self._live.supports_adapters:
            return None
        return self._live.adapter_version(candidate_slot(segment))

    async def load_candidate_adapter(self, segment: str, adapter: CheckpointDir, version: int) -> float:
        """Load `adapter` into `segment`'s candidate slot of the live engine; returns the load's seconds.
        Raises the engine's AdapterUnusable / AdaptersUnsupported (the slot keeps what it held)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await self._live.update_adapter(candidate_slot(segment), adapter, version)
        return loop.time() - start

    async def drop_candidate_adapter(self, segment: str) -> int | None:
        """Empty `segment`'s candidate slot (running responses on it finish); returns its version."""
        version = self.candidate_adapter_version(segment)
        if version is not None:
            await self._live.update_adapter(candidate_slot(segment), None, self._live.version)
        return version

    async def promote_adapter(self, segment: str) -> int:
        """`segment`'s candidate adapter serves every request of the segment, at once, with no load (the
        slot is then empty; the segment's old adapter is unloaded once no response runs on it). Returns
        its version. Raises NoCandidate."""
        move = getattr(self._live, "move_adapter", None)
        if move is None:
            raise AdaptersUnsupported(f"{self._live.name} engine: no adapter slots to promote from")
        try:
            version = await move(candidate_slot(segment), segment)
        except LookupError as exc:
            raise NoCandidate(str(exc)) from None
        log.info("segment %s: candidate adapter version %d promoted: it serves every user of the segment", segment, version)
        return version
