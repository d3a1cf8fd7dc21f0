"""The release gate's candidates in the engine (server/control/gate.py decides, this acts): `Candidates` loads,
promotes and drops the candidate of each lineage under the gate, under the activator's lock and with
its weights path and verification (server/control/activator.py), so a candidate and an activation never
interleave and a candidate's weights are checked exactly as an activation's. It changes no status but
the promotion's (`activate_version`, asked of the store as every activation is).

- The base lineage: the candidate engine of the `CanaryEngine` (server/engines/canary.py). `load`
  finds the weights (`Activator.weights`, server/control/version_weights.py: memory, then the durable checkpoint); unverified weights mark the row
  FAILED, missing ones are waited for, a load that fails marks a candidate FAILED. `promote`: the store
  is asked first (`check_activation`), the candidate engine becomes the live one at once
  (`CanaryEngine.promote`, no load), then one store transaction makes it SERVING (`Activator.change`); refused there, the
  engines swap back and the activation is dropped, unless another replica promoted it first.
- A segment's adapter lineage: the segment's candidate slot in the live engine
  (`CanaryEngine.load_candidate_adapter`, from the version's durable checkpoint, verified against its
  row as an adapter activation is: the slot loads the verified private copy, removed after the load). `promote`: the store
  makes it SERVING (`activate_version`), then the slot's adapter becomes the segment's (`promote_adapter`: a
  table repoint, no load, that cannot fail once the slot holds it; the store goes first so that nothing
  has to be undone in the engine when it refuses: `Activator.record_then_repoint`). `drop` unloads the slot.
- A promotion is the leader's: it carries the gate's lease term (`term`), and a store that refuses it
  as a deposed leader's (StaleLeader) changes nothing; the engines swap back, the candidate stays
  loaded and no activation is dropped (the new leader decides on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from liveloop.segments import BASE, Lineage
from liveloop.server.control.outcomes import SwapResult
from liveloop.server.engines.canary import CandidateBusy, CanaryEngine
from liveloop.store import TransitionRefused, VersionRecord, VersionStatus
from liveloop.store.lease import StaleLeader
from liveloop.transport import WeightsUnverified

if TYPE_CHECKING:
    from liveloop.server.control.activator import Activator

log = logging.getLogger(__name__)


class Candidates:
    """The gate's hands on the engine: one candidate per lineage (the base weights', or a
    segment's adapters'), under the activator's lock and with its verified weights; a promotion of the
    base lineage is the activator's one swap-then-record-or-swap-back change."""

    def __init__(self, activator: Activator, engine: CanaryEngine):
        if not isinstance(engine, CanaryEngine):
            raise TypeError("the release gate needs a CanaryEngine (server/engines/canary.py)")
        self.activator = activator
        self.engine = engine

    def loaded(self, lineage: Lineage) -> int | None:
        """The version the lineage's candidate slot holds in this replica (None: none)."""
        return self.engine.candidate_version if lineage.is_base else self.engine.candidate_adapter_version(lineage.segment)

    # -- load ----------------------------------------------------------------------------------------
    async def load(self, record: VersionRecord) -> bool:
        """Load `record` into its lineage's candidate slot (users reach it only as the gate routes
        them): the base lineage's candidate engine, or a segment's candidate adapter slot. True once it
        is the loaded candidate (at once when it is already); False otherwise (also when the candidate
        engine is still busy, or the weights are not written yet: tried again at the next pass). Changes
        no status but FAILED for weights that fail verification or do not load."""
        a, lineage = self.activator, Lineage.of(record)
        async with a.lock:
            if self.loaded(lineage) == record.version:
                return True
            with contextlib.ExitStack() as stack:
                try:
                    source, via, _ = await asyncio.to_thread(a.weights.find, record, stack)
                except WeightsUnverified as exc:
                    await a.reject(record, exc)
                    return False
                if source is None:
                    await a.wait_for_weights(record)
                    return False
                try:
                    if lineage.is_base:
                        seconds = await self.engine.load_candidate(source, record.version)
                    else:
                        seconds = await self.engine.load_candidate_adapter(lineage.segment, source, record.version)
                except CandidateBusy as exc:
                    log.info("candidate %d not loaded yet: %s", record.version, exc)
                    return False
                except Exception:
                    log.exception("%s: could not load version %d as the candidate", lineage, record.version)
                    await self._failed_load(record)
                    return False
        a.metrics.observe("server/candidate_load_seconds", seconds, transport=via)
        log.info("%s: version %d loaded as the candidate in %.0f ms via %s", lineage, record.version, seconds * 1000, via)
        return True

    async def _failed_load(self, record: VersionRecord) -> None:
        if record.status in (VersionStatus.CANARY, VersionStatus.PUBLISHED):  # never a version that serves
            await self.activator.fail(record.version)
        self.activator.metrics.inc("server/swap_failures")

    # -- promote -------------------------------------------------------------------------------------
    async def promote(self, record: VersionRecord, term: int | None = None) -> SwapResult | None:
        """Promote the loaded candidate `record` as the leader of `term` (see the module docstring).
        None when it was not promoted (not the loaded candidate; the store refused: the activation is
        dropped; or this replica no longer leads in `term`: nothing changed)."""
        if record.segment is not None:
            return await self._promote_adapter(record, term)
        a, engine = self.activator, self.engine
        async with a.lock:
            if engine.candidate_version != record.version:
                return None
            try:
                await asyncio.to_thread(a.versions.check_activation, record.version, term)
            except StaleLeader as exc:
                log.warning("candidate %d not promoted: %s", record.version, exc)
                return None
            except TransitionRefused as exc:
                if not await a.serves_now(record.version):
                    await a.drop(record.version, str(exc))
                    engine.drop_candidate()
                return None
            previous = engine.version

            async def swap() -> float:
                engine.promote()  # the candidate engine becomes the live one: no load
                return 0.0

            async def commit() -> None:
                try:
                    await asyncio.to_thread(a.versions.activate_version, record.version, None, term)
                except TransitionRefused:
                    if not await a.serves_now(record.version):
                        raise
                    # another replica promoted it first: it serves

            async def undo() -> None:
                engine.demote(record.version)

            try:
                seconds, _, _ = await a.change(swap, commit, undo)
            except StaleLeader as exc:
                log.warning("candidate %d not promoted: %s", record.version, exc)
                return None
            except TransitionRefused as exc:
                engine.drop_candidate()
                await a.drop(record.version, str(exc))
                return None
            a.metrics.inc("server/swaps")
            a.last_swap_via = "promotion"
            await a.weights.loaded(record, None)
            return SwapResult(record.version, previous, seconds * 1000, 0.0)

    async def _promote_adapter(self, record: VersionRecord, term: int | None) -> SwapResult | None:
        a, segment = self.activator, record.segment
        assert segment is not None
        async with a.lock:
            if self.engine.candidate_adapter_version(segment) != record.version:
                return None
            previous = self.engine.adapter_version(segment)

            async def commit() -> bool:
                try:
                    await asyncio.to_thread(a.versions.activate_version, record.version, None, term)
                except StaleLeader as exc:  # nothing to undo: the slot's adapter was not repointed yet
                    log.warning("segment %s: candidate adapter %d not promoted: %s", segment, record.version, exc)
                    return False
                except TransitionRefused as exc:
                    if not await a.serves_now(record.version):  # rolled back or replaced: never serves
                        await a.drop(record.version, str(exc))
                        await self.engine.drop_candidate_adapter(segment)
                        return False
                return True  # recorded (or another replica promoted it first: it serves)

            async def repoint() -> None:
                await self.engine.promote_adapter(segment)

            seconds = await a.record_then_repoint(commit, repoint)  # the store first, then the slot repointed
            if seconds is None:
                return None
            a.metrics.inc("server/adapter_swaps", segment=segment)
            log.info("segment %s: candidate adapter %d promoted over %s", segment, record.version, previous)
            parent = previous if previous is not None else self.engine.version
            return SwapResult(record.version, parent, seconds * 1000, 0.0)

    # -- drop ----------------------------------------------------------------------------------------
    async def drop(self, lineage: Lineage = BASE) -> int | None:
        """No user is served the lineage's candidate any more (held, rolled back, replaced); returns its
        version (None: there was none)."""
        async with self.activator.lock:
            if lineage.is_base:
                return self.engine.drop_candidate()
            return await self.engine.drop_candidate_adapter(lineage.segment)
