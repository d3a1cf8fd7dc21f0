"""Rollback: serve a stored version again, through the activator's change path (server/control/activator.py
`switch`): the engine swaps atomically (drained, like any swap) to the version's verified durable
checkpoint, then one store transaction (`store.versions.rollback_to`) marks the later versions rolled
back and points the learner at it; refused there, the engine swaps back. An adapter version moves its
own segment only; a base version with `segment` given serves that segment the base weights again.
Rollbacks read durable checkpoints only, never a transport's memory. Forget-to-weights
(server/control/forgetting.py) and the alarms' guard roll back through here too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from liveloop.segments import Lineage
from liveloop.server.control.outcomes import AlreadyServing, NotServable, RollbackResult
from liveloop.store import ServingChanged, VersionNotFound, VersionRecord
from liveloop.transport import WeightsUnverified
from liveloop.transport.checkpoint_dir import is_checkpoint

if TYPE_CHECKING:
    from liveloop.server.control.activator import Activator

log = logging.getLogger(__name__)


async def rollback(
    a: Activator, version: int, api_key_id: str | None = None, reason: str | None = None, segment: str | None = None,
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
        record = await asyncio.to_thread(a.store.versions.get_version, version)
        if record is None:
            raise VersionNotFound(f"no policy version {version}")
        lineage = a.lineage(segment or record.segment)
        previous = a.serving_in(lineage)
        check_rollback(a, record, lineage, previous, expect_serving)

        async def commit() -> list[int]:
            return await asyncio.to_thread(
                a.store.versions.rollback_to, version, lineage.lane(a.learner_name), api_key_id, reason, lineage.segment,
                expect_serving, event, term,
            )

        with contextlib.ExitStack() as stack:
            source = None
            if record.segment is not None or lineage.is_base:  # a base version into a segment: no adapter
                try:
                    source, _, _ = await asyncio.to_thread(a.weights.find, record, stack, False)
                except WeightsUnverified as exc:
                    await a.reject(record, exc)
                    raise NotServable(f"version {version}'s checkpoint is not the one its row names: {exc}") from exc
                if source is None:
                    raise NotServable(f"version {version}'s durable checkpoint is not at {record.checkpoint_path} (not written yet, or lost)")
            result, rolled = await a.switch(lineage, version, source, "checkpoint_dir", commit, fail_row=False, counted=False)
        a.metrics.inc("server/rollbacks")
        a.metrics.observe("server/swap_hold_seconds", result.held_ms / 1000)
        log.warning("%s rolled back from version %s to %d (rolled back: %s)", lineage, previous, version, rolled)
        return RollbackResult(version, result.parent, rolled or [], result.swap_ms, result.held_ms, lineage.segment)


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
    if lineage.is_base and version != 0 and not is_checkpoint(record.checkpoint_path):  # rollbacks read durable checkpoints only
        raise NotServable(f"version {version}'s durable checkpoint is not at {record.checkpoint_path} (not written yet, or lost)")
