"""Start-up recovery: what a (re)starting server serves. The store's serving version, from its durable
checkpoint; else from the transport's memory (started from the nearest ancestor on disk, then swapped
to it: `finish_start`); else, after waiting for the learner to write the checkpoint, the nearest
ancestor that has one, recorded in the store in one transaction (`store.versions.recover_serving`: the versions
passed over FAILED, the ancestor SERVING), so the store says what serves. Never a missing or
half-written model, nor a checkpoint whose files are not the ones its row names (`_durable`: every
file, config and tokenizer included). The checkpoint the engine starts from is the verified private
copy (`StartPoint.copy`, liveloop/transport/checkpoint_dir.py's `verified_copy`): `weights_path` names
it, and `finish_start` removes it once the engine has loaded it (so does the StartPoint going away).

Where the deployment's shared memory cannot be had (every name under /dev/shm taken by another user:
liveloop/transport/private_dir.py), the server and its learner both resolve to the checkpoint_dir
backend (`TransportConfig.runnable_here`) and the server records a `transport_fallback` event
(`record_fallback`): it starts and publishes, only slower.

At start the server also sweeps what this deployment left in shared memory (`sweep_shared_memory`):
unfinished versions and versions nothing may serve any more, the engine copies of killed engines, and
it reports foreign files in its namespace (an operator event and `server/foreign_weight_files`). A fleet
(`[ray] enabled`) sweeps once, in its driver before any replica starts (liveloop/serve_ray.py): a
replica that Serve restarts while the learner writes a version must not remove it as unfinished. A
replica that starts late (restarted, or added) starts on the store's serving version like any server,
so it catches up on what was pushed while it was gone."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from liveloop.segments import BASE
from liveloop.server.control.activator import Activator
from liveloop.store import VersionRecord
from liveloop.metrics import Metrics
from liveloop.store.operator import OperatorQueries
from liveloop.store.status import VersionStatus
from liveloop.store.versions import VersionQueries
from liveloop.transport import HandleGone, Receiver, TransportConfig, WeightHandle, WeightsUnverified
from liveloop.transport import private_dir, shared_memory
from liveloop.transport.checkpoint_dir import PrivateCopy, is_checkpoint, verified_copy
from liveloop.transport.weights import CheckpointDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartPoint:
    """What a (re)starting server serves: `version`, started from the checkpoint `weights_path` (None:
    the base model), then, when `memory` is set, swapped to that version's weights from memory (its
    durable checkpoint is not written yet). `skipped`: newer versions passed over for having neither.
    `copy`: the verified private copy `weights_path` names (None: the base model, read in place)."""

    version: int
    weights_path: str | None
    start_version: int
    memory: WeightHandle | None = None
    skipped: tuple[int, ...] = ()
    copy: PrivateCopy | None = None

    def release(self) -> None:
        """Remove the private copy the engine started from (it has loaded it)."""
        if self.copy is not None:
            self.copy.close()


async def start_point(
    versions: VersionQueries, record: VersionRecord, receiver: Receiver | None, wait_seconds: float = 0.0, poll_seconds: float = 0.5
) -> StartPoint:
    """Where to start serving `record` (the store's serving version). Its durable checkpoint when it
    exists; else its memory if a transport still holds it (started from the nearest ancestor on disk,
    then swapped); else, after waiting up to `wait_seconds` for the learner to write the checkpoint,
    the nearest ancestor with one: the passed-over versions are marked FAILED and the ancestor SERVING,
    so the store says what serves. Never a missing or half-written model."""
    if record.version == 0:
        return StartPoint(0, None, 0)
    copy = await asyncio.to_thread(_durable, versions, record)
    if copy is not None:
        return StartPoint(record.version, str(copy.path), record.version, copy=copy)
    ancestor, ancestor_copy = await asyncio.to_thread(_durable_ancestor, versions, record)
    base_path = str(ancestor_copy.path) if ancestor_copy is not None else None
    if receiver is not None:
        handle = receiver.handle_of(record)  # verified against the row's nonce and digest
        try:
            with receiver.open(handle):
                return StartPoint(record.version, base_path, ancestor.version, memory=handle, copy=ancestor_copy)
        except HandleGone:
            pass
        except WeightsUnverified as exc:
            log.error("version %d: its memory is not the one its row names (%s): not used", record.version, exc)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(poll_seconds)
        fresh = await asyncio.to_thread(versions.get_version, record.version)  # the digest its learner records
        if fresh is not None and (copy := await asyncio.to_thread(_durable, versions, fresh)) is not None:
            if ancestor_copy is not None:
                ancestor_copy.close()
            return StartPoint(record.version, str(copy.path), record.version, copy=copy)
    skipped: list[int] = []
    current = record
    while current.version != ancestor.version:
        skipped.append(current.version)
        current = await asyncio.to_thread(versions.get_version, current.parent)
    await asyncio.to_thread(versions.recover_serving, skipped, ancestor.version)
    log.error("version %d has no weights (durable checkpoint missing, memory gone): serving version %d instead (failed: %s)",
              record.version, ancestor.version, skipped)
    return StartPoint(ancestor.version, base_path, ancestor.version, skipped=tuple(skipped), copy=ancestor_copy)


def _durable(versions: VersionQueries, record: VersionRecord) -> PrivateCopy | None:
    """`record`'s durable checkpoint, copied privately and verified against the digest its row names;
    None when it is not there or does not match (a mismatch is logged and recorded as a
    "weights_rejected" event: that checkpoint never serves)."""
    if not is_checkpoint(record.checkpoint_path or ""):
        return None
    try:
        return verified_copy(record.checkpoint_path, record.checkpoint_sha256, record.version)
    except WeightsUnverified as exc:
        log.error("version %d: its checkpoint is not the one its row names (%s): not served", record.version, exc)
        versions.reject_weights(record.version, {"reason": str(exc), "at": "start"})
        return None


def _durable_ancestor(versions: VersionQueries, record: VersionRecord) -> tuple[VersionRecord, PrivateCopy | None]:
    """The nearest ancestor of `record` whose durable checkpoint exists (version 0, the base, at worst),
    with its verified copy (None for the base)."""
    current = record
    while current.version != 0 and current.parent is not None:
        parent = versions.get_version(current.parent)
        if parent is None:
            break
        current = parent
        if current.version == 0:
            return current, None
        copy = _durable(versions, current)
        if copy is not None:
            return current, copy
    base = versions.get_version(0)
    assert base is not None, "version 0 (the base model) always exists"
    return base, None


async def finish_start(activator: Activator, point: StartPoint) -> None:
    """After `engine.start(point.start_version, point.weights_path)`: the private copy it started from
    goes, then the engine swaps to the version's memory (when the point says so)."""
    point.release()
    if point.memory is None or activator.receiver is None:
        return
    await activator.resume_from_memory(point.version, point.memory)


async def start_instead(activator: Activator, point: StartPoint) -> None:
    """The memory `finish_start` was to swap in went (or changed) between the two looks: serve `point`
    instead (start_point's second answer, without memory: the durable checkpoint, or an ancestor's),
    through the activator's path; the private copy goes after."""
    try:
        if point.start_version != activator.engine.version and point.weights_path:
            async with activator.lock:
                await activator.switch(BASE, point.start_version, CheckpointDir(Path(point.weights_path)), "checkpoint_dir", fail_row=False)
    finally:
        point.release()


# the statuses whose memory may still be swapped in (or serves now)
_MEMORY_KEPT = frozenset({VersionStatus.PUBLISHED, VersionStatus.LOADING, VersionStatus.SERVING, VersionStatus.CANARY})


def record_fallback(operator: OperatorQueries, configured: TransportConfig, used: TransportConfig) -> None:
    """When the deployment's shared memory could not be had here (`TransportConfig.runnable_here`: every
    name under /dev/shm taken by another user) and versions travel through checkpoint directories
    instead: a `transport_fallback` operator event saying so, and why. Nothing otherwise."""
    if used.backend == configured.backend:
        return
    why = replace(used, backend=configured.backend).unusable_here() or "shared memory was unusable at start"
    operator.record_event("transport_fallback", detail={"configured": configured.backend, "used": used.backend, "reason": why})


def sweep_shared_memory(versions: VersionQueries, operator: OperatorQueries, transport: TransportConfig, metrics: Metrics) -> None:
    """At start: remove what this deployment left in shared memory (unfinished versions, versions whose
    row is gone or can no longer serve, the copies of engines that were killed), and report the foreign
    files of its namespace (logged, an operator event, `server/foreign_weight_files`; never fatal)."""
    copies = private_dir.sweep_engine_copies()
    if copies:
        log.warning("removed %d engine weight copies that killed processes left in shared memory", len(copies))
    if transport.backend not in ("shared_memory", "ipc"):
        return

    def servable(version: int) -> bool:
        record = versions.get_version(version)
        return record is not None and record.status in _MEMORY_KEPT

    removed, foreign = shared_memory.sweep(transport.namespace, servable)
    if removed:
        log.info("shared memory: removed versions %s that nothing serves any more", removed)
    if foreign:
        metrics.inc("server/foreign_weight_files", len(foreign))
        operator.record_event("foreign_weights", detail={"files": [{"path": f.path, "why": f.why} for f in foreign]})
