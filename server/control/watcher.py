"""The watcher: what makes this replica serve what the store says, and what learners publish, through the
activator (server/control/activator.py). Each pass (`watch`, every `[server] watch_seconds`, and at once
when a co-located learner rings the transport's bell at a publish: liveloop/transport/bell.py) first
follows the store (`follow`), then activates the newest published version of each unpaused, ungated
lineage. At start it restores what the store says serves (`restore_adapters`, `resume_from_memory`).

The follower rule: several replicas (Ray Serve, liveloop/serve_ray.py) share one store, and the store's
serving version is what every replica serves. `follow` swaps this replica's engine to the store's serving
version of each lineage (the base, each segment's adapter) wherever they differ, with the activation's
weights path and verification but no status change, paused or not. So a replica never serves what the
store does not say serves (but for a watch interval), and never moves to an older version unless the
store rolled back to it. A follower whose candidate slot (server/control/candidates.py) already holds
the version another replica promoted promotes it locally instead of loading it again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from liveloop.segments import BASE, Lineage
from liveloop.server.control.outcomes import SwapFailed, SwapResult
from liveloop.server.engines.canary import CanaryEngine
from liveloop.store import VersionRecord, VersionStatus
from liveloop.transport import WeightHandle, WeightsUnverified

if TYPE_CHECKING:
    from liveloop.server.control.activator import Activator

log = logging.getLogger(__name__)

RING_RETRY_SECONDS = 0.002  # after a ring, how soon the watcher looks again for the rung version's row (then doubling)
RING_PATIENCE_SECONDS = 0.25  # and for how long (then its polls find it, or it was never recorded)


class Watcher:
    """The activator's loop: follow the store, activate what learners publish, restore at start."""

    def __init__(self, activator: Activator):
        self.activator = activator
        self.looked_at = 0.0  # when the last pass began (wall clock)
        self._unfollowable: set[int] = set()  # serving versions whose weights failed verification here

    # -- the follower rule -------------------------------------------------------------------------------
    async def follow(self) -> list[SwapResult]:
        """Swap this replica's engine to the store's serving version of each lineage where they differ.
        A version whose weights are not readable yet (memory gone, durable checkpoint still being
        written) is tried again at the next pass; one whose weights fail verification is not tried again
        while it serves (an event records it). Returns the swaps made."""
        a = self.activator
        async with a.lock:
            done = []
            record = await asyncio.to_thread(a.versions.latest_version)
            if record is not None and record.version != a.engine.version and record.version not in self._unfollowable:
                result = await self._follow(record, BASE)
                if result is not None:
                    done.append(result)
            if a.segments:
                serving = await asyncio.to_thread(a.versions.serving_adapters)
                for segment in a.segments:
                    result = await self._follow_adapter(Lineage(segment), serving.get(segment))
                    if result is not None:
                        done.append(result)
            return done

    async def _follow_adapter(self, lineage: Lineage, record: VersionRecord | None) -> SwapResult | None:
        """A segment's adapter as the store says it serves (None: the base weights serve it)."""
        a = self.activator
        current = a.serving_in(lineage)
        if record is None:
            if current is None:
                return None
            result, _ = await a.switch(lineage, a.engine.version, None, "checkpoint_dir", fail_row=False, counted=False)
            log.info("%s: followed the store back to the base weights (from adapter %d)", lineage, current)
            return result
        if record.version == current or record.version in self._unfollowable or not record.checkpoint_path:
            return None
        return await self._follow(record, lineage)

    async def _follow(self, record: VersionRecord, lineage: Lineage) -> SwapResult | None:
        a = self.activator
        engine = a.engine
        if isinstance(engine, CanaryEngine) and _candidate_in(engine, lineage) == record.version:
            previous = a.serving_in(lineage)  # another replica promoted the candidate this one holds: no load
            if lineage.is_base:
                engine.promote()
            else:
                await engine.promote_adapter(lineage.segment)
            a.metrics.inc("server/follows")
            log.info("%s: followed the store to version %d (from %s): the candidate here, promoted", lineage, record.version, previous)
            return SwapResult(record.version, previous if previous is not None else engine.version, 0.0, 0.0)
        with contextlib.ExitStack() as stack:
            try:
                source, via, handle = await asyncio.to_thread(a.weights.find, record, stack)
            except WeightsUnverified as exc:
                self._unfollowable.add(record.version)
                await a.reject(record, exc)
                return None
            if source is None:
                log.debug("version %d serves, but its weights are not readable here yet", record.version)
                return None
            try:
                result, _ = await a.switch(lineage, record.version, source, via)
            except SwapFailed:
                log.exception("%s: could not follow the store to version %d", lineage, record.version)
                return None
        a.metrics.inc("server/follows")
        log.info("%s: followed the store to version %d (from %d) in %.0f ms via %s", lineage, record.version, result.parent, result.swap_ms, via)
        await a.weights.loaded(record, handle)
        return result

    # -- restore at start ------------------------------------------------------------------------------
    async def restore_adapters(self) -> None:
        """Serve each segment the adapter version the store says it serves (verified; one whose weights
        fail verification is rejected, and the base weights serve that segment)."""
        a = self.activator
        async with a.lock:
            serving = await asyncio.to_thread(a.versions.serving_adapters)
            for segment, record in serving.items():
                if segment not in a.segments or not record.checkpoint_path:
                    continue
                with contextlib.ExitStack() as stack:
                    try:
                        source, _, _ = await asyncio.to_thread(a.weights.find, record, stack)
                    except WeightsUnverified as exc:
                        self._unfollowable.add(record.version)
                        await a.reject(record, exc)
                        continue
                    if source is not None:
                        await a.switch(Lineage(segment), record.version, source, "checkpoint_dir", fail_row=False, counted=False)

    async def resume_from_memory(self, version: int, handle: WeightHandle) -> None:
        """server/control/startup.py `finish_start`: the engine started from the nearest ancestor on
        disk; swap it to `version`'s weights from the transport's memory (verified against the row:
        nonce and digest). The store says `version` serves already: nothing to record."""
        a = self.activator
        assert a.receiver is not None
        async with a.lock:
            with a.receiver.open(handle) as source:
                await a.switch(BASE, version, source, a.receiver.backend, fail_row=False)

    # -- the loop --------------------------------------------------------------------------------------
    async def watch_adapters(self) -> None:
        """One pass over the segments: each unpaused, ungated one gets its newest published adapter, swapped
        in for that segment only (no drain: running responses keep the adapter they started with)."""
        a = self.activator
        for segment in a.segments:
            if segment in a.gate_segments or await asyncio.to_thread(a.operator.learning_paused, a.lane(Lineage(segment))):
                continue
            current = a.engine.adapter_version(segment)
            published = await asyncio.to_thread(a.versions.versions_with_status, VersionStatus.PUBLISHED, current or -1, segment)
            if published:
                done = await a.activate(published[-1])
                if done:
                    log.info("segment %s: activated adapter version %d in %.0f ms", segment, done.version, done.swap_ms)

    async def watch(self, poll_seconds: float) -> None:
        """Each pass: `follow`, then activate the newest PUBLISHED version past the serving one (its
        activation supersedes the older published ones), unless learning is paused or the gate holds
        the lineage. Passes run every `poll_seconds`, and at once on a ring. The rung version's row is
        written just after its memory, so until a pass sees it the watcher looks again after
        RING_RETRY_SECONDS, doubling, for up to RING_PATIENCE_SECONDS. Runs until cancelled."""
        a = self.activator
        bell = a.receiver.bell() if a.receiver is not None else None
        expected, retry, until = -1, RING_RETRY_SECONDS, 0.0  # the newest version rung whose row no pass has seen yet
        try:
            while True:
                try:
                    self.looked_at = time.time()
                    await self.follow()
                    if a.segments:
                        await self.watch_adapters()
                    if a.gate_base or await asyncio.to_thread(a.operator.learning_paused, a.learner_name):
                        expected = -1  # nothing this watcher activates: no hurry
                    else:
                        published = await asyncio.to_thread(a.versions.versions_with_status, VersionStatus.PUBLISHED, a.engine.version)
                        if published and published[-1].version >= expected:
                            expected = -1
                        if published:
                            done = await a.activate(published[-1])
                            if done:
                                log.info("activated version %d in %.0f ms (from %s)", done.version, done.swap_ms, a.last_swap_via)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("version watcher")
                if bell is None:
                    await asyncio.sleep(poll_seconds)
                    continue
                hurry = expected > a.engine.version and time.monotonic() < until
                rung = await bell.wait(retry if hurry else poll_seconds)
                retry = min(2 * retry, poll_seconds) if hurry else RING_RETRY_SECONDS
                if rung and max(rung) > max(expected, a.engine.version):
                    expected, retry, until = max(rung), RING_RETRY_SECONDS, time.monotonic() + RING_PATIENCE_SECONDS
        finally:
            if bell is not None:
                bell.close()


def _candidate_in(engine: CanaryEngine, lineage: Lineage) -> int | None:
    return engine.candidate_version if lineage.is_base else engine.candidate_adapter_version(lineage.segment)
