"""Rollback: serve a stored version again, through the activator's change path (server/control/activator.py
`switch`): the engine swaps atomically (drained, like any swap) to the version's verified durable
checkpoint, then one store transaction (`store.versions.rollback_to`) marks the later versions rolled
back and points the learner at it; refused there, the engine swaps back. An adapter version moves its
own segment only; a base version rolled back into a segment's `lineage` serves that segment the base weights again.
A rollback reads its target's memory while the transport holds it, else its durable checkpoint, waiting
up to `durable_wait_seconds` for one its learner is still writing (`rollback_weights`: rolling back to
the serving version's parent under ratings). Forget-to-weights (server/control/forgetting.py) and the
alarms' guard roll back through here too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from liveloop.segments import Lineage
from liveloop.server.control.outcomes import AlreadyServing, NotServable, RollbackResult
from liveloop.server.control.version_weights import being_written
from liveloop.store import ServingChanged, VersionNotFound, VersionRecord
from liveloop.transport import WeightsUnverified
from liveloop.transport.weights import WeightSource

if TYPE_CHECKING:
    from liveloop.server.control.activator import Activator

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05  # how often a rollback looks for its target's durable checkpoint being written


async def rollback(
    a: Activator, version: int, api_key_id: str | None = None, reason: str | None = None, lineage: Lineage | None = None,
    expect_serving: int | None = None, event: tuple[str, dict] | None = None, term: int | None = None,
) -> RollbackResult:
    """Serve stored `version` again (see the module docstring). With `expect_serving` (the version the
    operator saw serving that lineage) it is refused, before anything swaps and again in the store's
    transaction, when another serves now (ServingChanged). Raises VersionNotFound, NotServable,
    AlreadyServing, SwapFailed, UnknownSegment or the store's RollbackRefused. `event` (kind, detail): an
    operator event recorded in the rollback's own transaction (the guard's verdict). `term`: the leader
    lease's term a leader's rollback carries (store/lease.py `fenced`; None: an operator's, unfenced): a
    deposed leader's is refused in the store's transaction (StaleLeader) and the engine swaps back."""
    async with a.lock:
        record = await asyncio.to_thread(a.versions.get_version, version)
        if record is None:
            raise VersionNotFound(f"no policy version {version}")
        lineage = a.known(lineage if lineage is not None and not lineage.is_base else Lineage.of(record))
        previous = a.serving_in(lineage)
        check_rollback(a, record, lineage, previous, expect_serving)

        async def commit() -> list[int]:
            return await asyncio.to_thread(
                a.versions.rollback_to, version, lineage.lane(a.learner_name), api_key_id, reason, lineage.segment,
                expect_serving, event, term,
            )

        with contextlib.ExitStack() as stack:
            source = None
            if record.segment is not None or lineage.is_base:  # a base version into a segment: no adapter
                source = await rollback_weights(a, record, stack)
            result, rolled = await a.switch(lineage, version, source, "checkpoint_dir", commit, fail_row=False, counted=False)
        a.metrics.inc("server/rollbacks")
        a.metrics.observe("server/swap_hold_seconds", result.held_ms / 1000)
        log.warning("%s rolled back from version %s to %d (rolled back: %s)", lineage, previous, version, rolled)
        return RollbackResult(version, result.parent, rolled or [], result.swap_ms, result.held_ms, lineage)


def check_rollback(a: Activator, record: VersionRecord, lineage: Lineage, previous: int | None, expect_serving: int | None) -> None:
    """Refuse, before anything swaps, a rollback that cannot be done (`rollback`'s refusals)."""
    version, serving = record.version, a.engine.version
    seen = previous if previous is not None else serving
    if expect_serving is not None and expect_serving != seen:
        where = "" if lineage.is_base else f" segment {lineage.segment!r}"
        raise ServingChanged(f"version {expect_serving} no longer serves{where} (now: v{seen})")
    if not lineage.is_base:
        if record.segment is not None and record.segment != lineage.segment:
            raise NotServable(f"version {version} is segment {record.segment!r}'s adapter, not {lineage.segment!r}'s")
        if record.segment is None and version != serving:
            raise NotServable(f"version {version} is not the base version serving now ({serving})")
        if previous == version or (previous is None and record.segment is None):
            raise AlreadyServing(f"segment {lineage.segment!r} is already served by version {version}")
    elif version == previous:
        raise AlreadyServing(f"version {version} is already serving")
    if record.segment is None and not lineage.is_base:
        return  # the base weights serve the segment again: nothing to load
    if not record.status.servable or not record.checkpoint_path:
        raise NotServable(f"version {version} cannot be served (status {record.status})")
    if record.pruned_at is not None:
        raise NotServable(
            f"version {version}'s checkpoint was pruned at {record.pruned_at.isoformat()}: it cannot serve again "
            "(pin versions you may roll back to)"
        )
    # its weights (memory, or the durable checkpoint waited for a bounded time) are `rollback_weights`'s


async def rollback_weights(a: Activator, record: VersionRecord, stack: contextlib.ExitStack) -> WeightSource:
    """A rollback target's weights, verified as every load's: its in-memory copy while the transport still
    holds it, else its durable checkpoint. A version published in memory whose durable checkpoint its
    learner has not written yet (learner/publishing.py writes it within about a publish interval, under
    traffic too) is waited for, up to `durable_wait_seconds`. NotServable when the checkpoint is lost,
    or not written within that bound (its learner died: its resume recovers it from memory)."""
    version = record.version
    deadline = time.monotonic() + a.weights.durable_wait_seconds
    waited = False
    while True:
        try:
            source, _, _ = await asyncio.to_thread(a.weights.find, record, stack, True)
        except WeightsUnverified as exc:
            await a.reject(record, exc)
            raise NotServable(f"version {version}'s checkpoint is not the one its row names: {exc}") from exc
        if source is not None:
            if waited:
                log.info("rollback: version %d's durable checkpoint was written while the rollback waited", version)
            return source
        if not being_written(record) or record.pruned_at is not None or time.monotonic() >= deadline:
            raise NotServable(f"version {version}'s durable checkpoint is not at {record.checkpoint_path} (not written yet, or lost)")
        if not waited:
            log.info("rollback: waiting up to %.0f s for version %d's durable checkpoint", a.weights.durable_wait_seconds, version)
            waited = True
        await asyncio.sleep(POLL_SECONDS)
        fresh = await asyncio.to_thread(a.versions.get_version, version)
        if fresh is None:
            raise VersionNotFound(f"no policy version {version}")
        record = fresh
