"""What serves in this replica's engine, and the one path that changes it. The store owns version state
(store/versions.py): the activator asks the store and acts on its answer; publishing is the learner's.

The change path: every change of what the engine serves, in either kind of lineage (`Lineage`), is one
window opened here, under the activator's lock: `change` (the engine swaps, then the store records it;
refused, the engine swaps back) or `record_then_repoint` (the store first, then a repoint that cannot
fail); `switch` is `change` with weights verified against the row (version_weights.py). Activation,
rollback (rollback.py), the follower rule and restores (watcher.py) and the gate's promotions
(candidates.py) all take it.

Activation: a learner's published version (`activate`) or an operator's imported checkpoint
(`activate_import`), one swap-in (`_swap_in`) between the store's word under the lock
(`check_activation`) and its transaction that checks again: SERVING, the old version RETIRED, the
published ones it overtook SUPERSEDED. A learner's activation that lost a race is dropped (logged,
counted, an operator event); an operator's raises and its row becomes FAILED, and an operator's
version becomes the learner's lineage (the learner reloads, as after a rollback). A failed swap leaves
the old version serving. Results and refusals: server/control/outcomes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from liveloop.metrics import Metrics
from liveloop.segments import BASE, Lineage
from liveloop.server.control import rollback as rollbacks
from liveloop.server.control.outcomes import (  # AlreadyServing, NotServable: the edge and tests import them from here too
    AlreadyServing, CheckpointUnusable, NotServable, RollbackResult, SwapFailed, SwapResult, UnknownSegment,
)
from liveloop.server.control.settled import Changes
from liveloop.server.control.version_weights import VersionWeights
from liveloop.server.control.watcher import Watcher
from liveloop.server.control.weights_import import StagedCheckpoint
from liveloop.server.engines.base import Engine
from liveloop.store import TransitionRefused, VersionRecord, VersionStatus
from liveloop.store.operator import OperatorQueries
from liveloop.store.versions import VersionQueries
from liveloop.transport import Receiver, WeightHandle, WeightsUnverified
from liveloop.transport.weights import WeightSource

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class _SwappedIn:
    """The swap-in step's swap, the transport handle read (None: a checkpoint), when the weights were found."""

    result: SwapResult
    handle: WeightHandle | None
    opened: float


class Activator:
    """The change path and activation of one replica's engine (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        versions: VersionQueries,
        operator: OperatorQueries,
        metrics: Metrics,
        learner_name: str = "sao",
        segments: tuple[str, ...] = (),
        receiver: Receiver | None = None,
        durable_wait_seconds: float = 60.0,
        keep_serving_memory: bool = False,
        gate_base: bool = False,
        gate_segments: tuple[str, ...] = (),
    ):
        self.engine = engine
        self.versions = versions
        self.operator = operator  # where the learner's pause is read (the watcher)
        self.metrics = metrics
        self.learner_name = learner_name  # whose pause also holds back activation
        self.segments = segments  # the segments with adapter lineages (empty: adapters are off)
        self.receiver = receiver  # the transport's end (None: checkpoint directories only)
        self.weights = VersionWeights(receiver, durable_wait_seconds, keep_serving_memory)  # the one place weights come from
        self.last_swap_via = ""  # where the last swap's weights came from: a transport backend's name
        # the release gate (server/control/gate.py) decides what of the base lineage serves: the watcher activates none of it
        self.gate_base = gate_base
        self.gate_segments = frozenset(gate_segments)  # and of these segments' adapter lineages
        self.lock = asyncio.Lock()  # one change of what serves at a time (the gate's candidates take it too)
        self.changes = Changes()  # the swap-to-record windows; admin views read between them
        self.watcher = Watcher(self)  # follows the store, activates what learners publish (server/control/watcher.py)

    # -- lineages -------------------------------------------------------------------------------------
    def known(self, lineage: Lineage) -> Lineage:
        """`lineage` when it is the base weights' or a segment's this server has adapters for, else UnknownSegment."""
        if not lineage.is_base and lineage.segment not in self.segments:
            raise UnknownSegment(f"segment {lineage.segment!r} has no adapters here (segments: {', '.join(self.segments) or 'none'})")
        return lineage

    def lanes(self) -> list[Lineage]:
        """The lineages a learner trains here: each segment's with adapters, else the base weights'."""
        return [Lineage(s) for s in self.segments] or [BASE]

    def lane(self, lineage: Lineage) -> str:
        """The learner_cursor / learner_control name of a lineage (`sao`, or `sao:cozy`)."""
        return self.known(lineage).lane(self.learner_name)

    def serving_in(self, lineage: Lineage) -> int | None:
        """What the engine serves in a lineage: the base version, or a segment's adapter (None: the base)."""
        return self.engine.version if lineage.is_base else self.engine.adapter_version(lineage.segment)

    def serving_adapters(self) -> dict[str, int | None]:
        """Each segment's serving adapter version (None: the base weights serve it)."""
        return {segment: self.engine.adapter_version(segment) for segment in self.segments}

    @property
    def serving_version(self) -> int:
        return self.engine.version  # the version the engine serves now

    # -- the one swap-then-record-or-swap-back path -----------------------------------------------------
    async def change(
        self, swap: Callable[[], Awaitable[float]], commit: Callable[[], Awaitable[T]] | None, undo: Callable[[], Awaitable[None]],
    ) -> tuple[float, float, T | None]:
        """THE change of what serves, with the lock held: `swap()` the engine (returns the seconds it held
        new requests), then `commit()` (the store's transaction on it; None: the store says so already),
        and when the commit raises, `undo()` and re-raise: the engine and the store never disagree
        beyond this window (`changes`, which admin reads wait out). Returns (seconds, held, committed)."""
        with self.changes.changing():
            start = time.perf_counter()
            held = await swap()
            seconds = time.perf_counter() - start
            if commit is None:
                return seconds, held, None
            try:
                committed = await commit()
            except BaseException:
                await undo()
                raise
        return seconds, held, committed

    async def record_then_repoint(self, commit: Callable[[], Awaitable[bool]], repoint: Callable[[], Awaitable[None]]) -> float | None:
        """The change in the other order, lock held, for an engine step that cannot fail (a candidate
        adapter's promotion: a table repoint): `commit()` first (False: refused, nothing to undo), then
        `repoint()`. Returns the window's seconds, None when the store refused."""
        with self.changes.changing():
            start = time.perf_counter()
            if not await commit():
                return None
            await repoint()
        return time.perf_counter() - start

    async def switch(
        self, lineage: Lineage, version: int, weights: WeightSource | None, via: str,
        commit: Callable[[], Awaitable[T]] | None = None, fail_row: bool = True, counted: bool = True,
    ) -> tuple[SwapResult, T | None]:
        """`change` with a load: `weights` (verified; None for a segment: the base weights serve it) as
        `version` of `lineage`, then `commit`; refused, the version that served before is loaded back.
        A load that fails raises SwapFailed (the old version keeps serving; with `fail_row` the row is
        marked FAILED). `counted`: the swap's metrics are a swap's (a rollback counts its own)."""
        previous = self.serving_in(lineage)

        async def swap() -> float:
            return await self._load(lineage, weights, version, fail_row)

        seconds, held, committed = await self.change(swap, commit, lambda: self._swap_back(lineage, version, previous))
        if counted:
            self._count_swap(lineage, via, seconds, held)
        parent = previous if previous is not None else self.engine.version
        return SwapResult(version, parent, seconds * 1000, held * 1000), committed

    async def _load(self, lineage: Lineage, weights: WeightSource | None, version: int, fail_row: bool) -> float:
        preempted = self.engine.swap_preempted
        try:
            if lineage.is_base:
                assert weights is not None, "the base lineage always loads weights"
                return await self.engine.update_weights(weights, version)
            return await self.engine.update_adapter(lineage.segment, weights, version)
        except Exception as exc:
            if fail_row:
                await self.fail(version)
            self.metrics.inc("server/swap_failures")
            raise SwapFailed(version, f"could not load version {version}: {exc}") from exc
        finally:
            self.metrics.inc("server/swap_preempted", self.engine.swap_preempted - preempted)

    def _count_swap(self, lineage: Lineage, via: str, seconds: float, held: float) -> None:
        if lineage.is_base:
            self.metrics.observe("server/swap_seconds", seconds)
            self.metrics.observe("server/swap_seconds_by_transport", seconds, transport=via)
            self.metrics.observe("server/swap_hold_seconds", held)
            self.metrics.inc("server/swaps")
            self.last_swap_via = via
        else:
            self.metrics.observe("server/adapter_swap_seconds", seconds, segment=lineage.segment)
            self.metrics.inc("server/adapter_swaps", segment=lineage.segment)

    async def _swap_back(self, lineage: Lineage, version: int, previous: int | None) -> None:
        """The store refused `version` after the engine swapped it into `lineage`: serve `previous` again,
        its weights verified as any load's (a segment whose `previous` is None: the base weights)."""
        log.warning("version %d was refused after it swapped into %s: swapping version %s back", version, lineage, previous)
        try:
            old = await asyncio.to_thread(self.versions.get_version, previous) if previous is not None else None
            if not lineage.is_base and (old is None or old.segment is None):
                await self.engine.update_adapter(lineage.segment, None, self.engine.version)
                return
            if old is None:
                raise SwapFailed(previous or 0, f"no row for version {previous}")
            with contextlib.ExitStack() as stack:
                source, _, _ = await asyncio.to_thread(self.weights.find, old, stack)
                if source is None:
                    raise SwapFailed(old.version, f"no weights for version {old.version}")
                await self._load(lineage, source, old.version, fail_row=False)
        except Exception:
            self.metrics.inc("server/swap_failures")
            log.critical("version %d was refused after it swapped in, and version %s could not be swapped back", version, previous, exc_info=True)

    # -- what the other paths share (the gate's candidates use them too) ----------------------------------
    async def serves_now(self, version: int) -> bool:
        """Whether the store says `version` serves its lineage now (another replica activated it)."""
        record = await asyncio.to_thread(self.versions.get_version, version)
        return record is not None and record.status == VersionStatus.SERVING

    async def fail(self, version: int) -> None:
        """Mark `version` FAILED (unless it is already)."""
        try:
            await asyncio.to_thread(self.versions.fail_version, version)
        except TransitionRefused:
            pass

    async def reject(self, record: VersionRecord, exc: WeightsUnverified) -> None:
        """The weights found for `record` are not the ones its row names: nothing of them served; the
        serving version keeps serving, the row becomes FAILED with a "weights_rejected" event."""
        serving = self.serving_in(Lineage.of(record))
        log.error("version %d: weights rejected (%s): version %s keeps serving", record.version, exc, serving)
        self.metrics.inc("server/weights_rejected")
        await asyncio.to_thread(self.versions.reject_weights, record.version, {"reason": str(exc), "serving": serving})

    async def drop(self, version: int, reason: str) -> None:
        """An activation that lost a race: logged, counted, recorded by the store; never applied."""
        log.warning("activation of version %d dropped: %s", version, reason)
        self.metrics.inc("server/activations_dropped")
        await asyncio.to_thread(self.versions.drop_activation, version, reason)

    async def wait_for_weights(self, record: VersionRecord) -> None:
        """No weights yet: wait for its durable checkpoint (`VersionWeights.gave_up`), then mark it FAILED."""
        if self.weights.gave_up(record):
            await self.fail(record.version)
            self.metrics.inc("server/swap_failures")
            self.metrics.inc("server/versions_without_weights")

    # -- activation: a learner's, an operator's, over one swap-in step ----------------------------------
    async def activate(self, record: VersionRecord) -> SwapResult | None:
        """Swap in a version a learner published (base weights or a segment's adapter), from memory
        when its transport still holds it, else from its checkpoint directory. None if it is not newer,
        failed to load, its weights are not there yet (it is tried again at the next poll), or it lost
        a race: the store, asked under the lock, says it may not serve now (rolled back, off its
        lineage, something newer serves); such an activation is dropped, never applied."""
        async with self.lock:
            return await self._activate_published(record.version)

    async def activate_import(self, checkpoint: StagedCheckpoint, note: str | None = None, **row: object) -> SwapResult:
        """Serve an operator's checkpoint, copied and checked in already (server/control/weights_import.py),
        as the next version: its row first, as LOADING, under the number its copy is moved to (a response
        that records the new version always has its row), then `_activate_imported`. Raises
        CheckpointUnusable when the engine cannot load it (the row becomes FAILED), the import's
        ImportFailed, the store's TransitionRefused if the store no longer agrees on what serves."""
        async with self.lock:
            record = await asyncio.to_thread(checkpoint.record, self.versions, self.engine.version, note, **row)
            try:
                return await self._activate_imported(record.version)
            except SwapFailed as exc:
                raise CheckpointUnusable(checkpoint.source, f"could not load {checkpoint.source}: {exc.__cause__}") from exc

    async def _activate_published(self, version: int) -> SwapResult | None:
        """A learner's activation, lock held: the store's word, then `_swap_in`. Every refusal returns None:
        one before the swap or in the store's transaction (swapped back) drops the activation, unless
        another replica activated the version (`follow` swaps it in); missing weights are waited for."""
        began = time.time()
        try:
            record = await asyncio.to_thread(self.versions.check_activation, version)
        except TransitionRefused as exc:
            if not await self.serves_now(version):  # another replica activated it: `follow` swaps it in
                await self.drop(version, str(exc))
            return None
        current = self.serving_in(Lineage.of(record))
        if current is not None and version <= current:
            return None

        async def commit() -> Any:
            try:
                return await asyncio.to_thread(self.versions.activate_version, version, None)
            except TransitionRefused:
                if await self.serves_now(version):  # another replica activated it first: it serves (no drop, no swap back)
                    return None
                raise

        checked = time.time()
        try:
            done = await self._swap_in(record, commit, memory=True)
        except WeightsUnverified:
            return None
        except SwapFailed:
            log.exception("could not activate version %d", version)
            return None
        except TransitionRefused as exc:  # lost a race after the swap (a writer outside this lock): swapped back
            await self.drop(version, str(exc))
            return None
        if done is None:
            await self.wait_for_weights(record)
            return None
        switched = time.time()
        await self.weights.loaded(record, done.handle)
        self._timeline(record, began, checked, done.opened, switched, done.result)
        return done.result

    async def _activate_imported(self, version: int) -> SwapResult:
        """An operator's activation, lock held: as a learner's, but from its checkpoint only, every refusal
        raises (SwapFailed, the store's TransitionRefused) and marks the row FAILED, and the store's
        transaction moves the learner's cursor to the version."""
        try:
            record = await asyncio.to_thread(self.versions.check_activation, version)
        except TransitionRefused:
            await self.fail(version)
            raise
        lane = Lineage.of(record).lane(self.learner_name)

        async def commit() -> Any:
            return await asyncio.to_thread(self.versions.activate_version, version, lane)

        try:
            done = await self._swap_in(record, commit, memory=False)
        except WeightsUnverified as exc:
            raise SwapFailed(version, f"version {version}'s weights failed verification") from exc
        except TransitionRefused:
            await self.fail(version)
            raise
        if done is None:
            await self.fail(version)
            raise SwapFailed(version, f"version {version} has no weights at {record.checkpoint_path}")
        return done.result

    async def _swap_in(self, record: VersionRecord, commit: Callable[[], Awaitable[Any]], memory: bool) -> _SwappedIn | None:
        """The step both activations share, lock held, the store's word had: the weights, verified against
        the row before anything serves (WeightsUnverified: the row rejected), then `switch` (the swap,
        then `commit`; refused there: swapped back, TransitionRefused; a failed load: SwapFailed). None
        when no weights are there yet."""
        with contextlib.ExitStack() as stack:
            try:
                source, via, handle = await asyncio.to_thread(self.weights.find, record, stack, memory)
            except WeightsUnverified as exc:
                await self.reject(record, exc)
                raise
            opened = time.time()
            if source is None:
                return None
            result, activation = await self.switch(Lineage.of(record), record.version, source, via, commit)
        if activation is not None and activation.superseded:
            log.info("version %d superseded %s", record.version, activation.superseded)
        return _SwappedIn(result, handle, opened)

    def _timeline(self, record: VersionRecord, began: float, checked: float, opened: float, switched: float, result: SwapResult) -> None:
        """How long a published version took to serve here, by stage (wall clock, from the row's created_at):
        `server/publish_to_serve_seconds` and one log line (bench/feedback_to_live.py reads it)."""
        now = time.time()
        published = record.created_at.timestamp()
        looked = self.watcher.looked_at if self.watcher.looked_at >= published else began
        self.metrics.observe("server/publish_to_serve_seconds", now - published)
        log.info(
            "version %d served %.1f ms after its publish: found after %.1f ms, checked %.1f ms, weights %.1f ms, swap %.1f ms "
            "(held %.1f ms), recorded %.1f ms, freed %.1f ms",
            record.version, 1000 * (now - published), 1000 * (looked - published), 1000 * (checked - began), 1000 * (opened - checked),
            result.swap_ms, result.held_ms, 1000 * (switched - opened) - result.swap_ms, 1000 * (now - switched),
        )

    # -- rollback and the watcher's loop, on this activator (server/control/rollback.py, watcher.py) ----
    async def rollback(
        self, version: int, api_key_id: str | None = None, reason: str | None = None, lineage: Lineage | None = None,
        expect_serving: int | None = None, event: tuple[str, dict] | None = None, term: int | None = None,
    ) -> RollbackResult:
        return await rollbacks.rollback(self, version, api_key_id, reason, lineage, expect_serving, event, term)

    async def follow(self) -> list[SwapResult]:
        return await self.watcher.follow()

    async def watch(self, poll_seconds: float) -> None:
        await self.watcher.watch(poll_seconds)

    async def _watch_adapters(self) -> None:
        await self.watcher.watch_adapters()

    async def restore_adapters(self) -> None:
        await self.watcher.restore_adapters()

    async def resume_from_memory(self, version: int, handle: WeightHandle) -> None:
        await self.watcher.resume_from_memory(version, handle)

    @property
    def looked_at(self) -> float:
        """When the watcher's last pass began (wall clock; 0: never)."""
        return self.watcher.looked_at
