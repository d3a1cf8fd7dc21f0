"""Publishing a policy version into the live engine, with its row in the store.

Order matters for integrity: the `policy_versions` row is written first (status LOADING), so a
response that records the new version always has its row; then the engine swaps atomically; then the
row becomes SERVING and its parent RETIRED. A failed swap leaves the old version serving and the
row marked FAILED. Learners write their own rows (status PUBLISHED); `watch` activates them,
unless the operator paused learning. `rollback` swaps a stored version back in, then records it.

With adapters on (`segments` non-empty) each segment has its own lineage of adapter versions over the
frozen base: `watch` activates a segment's newest published adapter into the engine for that segment
only (no drain: running responses keep the adapter they started with), `rollback` of an adapter version
moves that segment alone, and a segment can go back to the base weights (rollback to a base version
with `segment` given). A segment's pause holds back only its own activations.

Results are typed (`SwapResult`, `RollbackResult`); refusals are domain exceptions (`CheckpointUnusable`,
`VersionNotFound`, `NotServable`, `AlreadyServing`, `SwapFailed`, the store's `RollbackRefused`) that
the HTTP edge maps to statuses (server/errors.py) and the background guard logs.

Weights come through the transport seam (liveloop/transport): with a `receiver`, `activate` reads a
published version from memory first (the learner sent it before recording the row, and writes the
durable checkpoint after, off the critical path), then from its checkpoint directory. A version whose
memory is gone and whose durable checkpoint is not written yet stays PUBLISHED and is tried again at the
next poll, for up to `durable_wait_seconds`; after that it is marked FAILED (its learner died before
writing it: the learner's resume rolls its lineage back), and the old version keeps serving. Nothing
ever serves a half-written or missing model. After a swap the receiver frees the memory of older
versions (and the new version's own once its durable checkpoint exists). Rollbacks and restarts read
durable checkpoints only; `start_point` picks what a (re)starting server serves when the serving
version's durable checkpoint is missing (memory if still there, else its nearest ancestor on disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from liveloop.checkpoint import checkpoint_digest

from liveloop.metrics import Metrics
from liveloop.server.engines.base import CheckpointDir, Engine, WeightSource
from liveloop.store import Store, VersionNotFound, VersionRecord, VersionStatus
from liveloop.transport import HandleGone, Receiver, WeightHandle
from liveloop.transport.checkpoint_dir import is_checkpoint

log = logging.getLogger(__name__)


class CheckpointUnusable(ValueError):
    """The directory an operator asked to publish is not a checkpoint the engine can load."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


class NotServable(RuntimeError):
    """A stored version cannot be swapped in: it never loaded, has no weights, or retention deleted them."""


class AlreadyServing(RuntimeError):
    """The version asked for is the one serving."""


class SwapFailed(RuntimeError):
    """The engine could not load a version's weights (the old version keeps serving)."""

    def __init__(self, version: int, message: str):
        super().__init__(message)
        self.version = version


@dataclass(frozen=True)
class SwapResult:
    """A version swapped in: which, on top of which, how long the swap took and held requests."""

    version: int
    parent: int
    swap_ms: float
    held_ms: float


@dataclass(frozen=True)
class RollbackResult:
    """A stored version served again: the one it replaced and the versions marked rolled back (for a
    segment's adapters: `segment` names it, and `previous` was its adapter version or the base's)."""

    version: int
    previous: int
    rolled_back: list[int]
    swap_ms: float
    held_ms: float
    segment: str | None = None


class UnknownSegment(LookupError):
    """A segment this server has no adapter lineage for (adapters are off, or it is not configured)."""


class Publisher:
    def __init__(
        self,
        engine: Engine,
        store: Store,
        metrics: Metrics,
        learner_name: str = "sao",
        segments: tuple[str, ...] = (),
        receiver: Receiver | None = None,
        durable_wait_seconds: float = 60.0,
    ):
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.learner_name = learner_name  # whose pause also holds back activation
        self.segments = segments  # the segments with adapter lineages (empty: adapters are off)
        self.receiver = receiver  # the transport's end (None: checkpoint directories only)
        self.durable_wait_seconds = durable_wait_seconds
        self._waiting: dict[int, float] = {}  # version -> when its weights were first found missing
        self.last_swap_via = ""  # where the last swap's weights came from: a transport backend's name
        self._lock = asyncio.Lock()

    def lane(self, segment: str | None) -> str:
        """The learner_cursor / learner_control name of a lineage (`sao`, or `sao:cozy`)."""
        if segment is not None and segment not in self.segments:
            raise UnknownSegment(f"segment {segment!r} has no adapters here (segments: {', '.join(self.segments) or 'none'})")
        return self.learner_name if segment is None else f"{self.learner_name}:{segment}"

    def serving_adapters(self) -> dict[str, int | None]:
        """Each segment's serving adapter version (None: the base weights serve it)."""
        return {segment: self.engine.adapter_version(segment) for segment in self.segments}

    async def restore_adapters(self) -> None:
        """At start: serve each segment the adapter version the store says it serves."""
        serving = await asyncio.to_thread(self.store.serving_adapters)
        for segment, record in serving.items():
            if segment in self.segments and record.checkpoint_path:
                await self.engine.update_adapter(segment, CheckpointDir(Path(record.checkpoint_path)), record.version)

    @property
    def serving_version(self) -> int:
        """The version the engine serves now."""
        return self.engine.version

    async def publish_dir(self, path: str, note: str | None = None, **row: object) -> SwapResult:
        """Serve the checkpoint in directory `path` as the next version (its row first, as LOADING).
        Raises CheckpointUnusable when `path` is no checkpoint or the engine cannot load it."""
        directory = Path(path)
        try:
            usable = directory.is_dir() and any(directory.glob("*.safetensors"))
        except OSError:  # a name too long, a permission: not a directory we can load
            usable = False
        if not usable:
            raise CheckpointUnusable(path, f"path: {path} is not a checkpoint directory with *.safetensors")
        async with self._lock:
            parent = self.engine.version
            version = await asyncio.to_thread(self.store.next_version)
            digest = await asyncio.to_thread(checkpoint_digest, directory)
            await asyncio.to_thread(
                self.store.add_version,
                version,
                parent=parent,
                checkpoint_path=str(directory.resolve()),
                checkpoint_sha256=digest,
                status=VersionStatus.LOADING,
                note=note,
                **row,
            )
            try:
                return await self._swap(version, str(directory))
            except SwapFailed as exc:
                raise CheckpointUnusable(path, f"could not load {path}: {exc.__cause__}") from exc

    async def activate(self, record: VersionRecord) -> SwapResult | None:
        """Swap in a version a learner published (row already written), from memory when its transport
        still holds it, else from its checkpoint directory; None if it is not newer, failed to load, or
        its weights are not there yet (it is tried again at the next poll)."""
        async with self._lock:
            if record.version <= self.engine.version:
                return None
            with contextlib.ExitStack() as stack:
                source, via, handle = await asyncio.to_thread(self._open, record, stack)
                if source is None:
                    await self._wait_for_weights(record)
                    return None
                self._waiting.pop(record.version, None)
                try:
                    result = await self._swap(record.version, source, via)
                except SwapFailed:
                    log.exception("could not activate version %d", record.version)
                    return None
            if self.receiver is not None:
                durable = await asyncio.to_thread(is_checkpoint, record.checkpoint_path or "")
                await asyncio.to_thread(self.receiver.loaded, handle or self._handle(record), durable)
            return result

    def _handle(self, record: VersionRecord) -> WeightHandle:
        assert self.receiver is not None
        return self.receiver.handle_for(record.version, record.checkpoint_path)

    def _open(self, record: VersionRecord, stack: contextlib.ExitStack) -> tuple[WeightSource | None, str, WeightHandle | None]:
        """The version's weights: its transport's memory first, then its durable checkpoint directory;
        (None, ...) when neither is there."""
        if self.receiver is not None:
            try:
                handle = self._handle(record)
                return stack.enter_context(self.receiver.open(handle)), self.receiver.backend, handle
            except HandleGone as exc:
                log.debug("version %d: %s; trying its checkpoint directory", record.version, exc)
        if record.checkpoint_path and is_checkpoint(record.checkpoint_path):
            return CheckpointDir(Path(record.checkpoint_path)), "checkpoint_dir", None
        return None, "", None

    async def _wait_for_weights(self, record: VersionRecord) -> None:
        """Its memory is gone and its durable checkpoint not written yet: wait (the learner writes it
        after the swap would have happened), up to durable_wait_seconds, then mark it FAILED."""
        first = self._waiting.setdefault(record.version, time.monotonic())
        waited = time.monotonic() - first
        if waited < self.durable_wait_seconds:
            if waited == 0:
                log.warning("version %d: no weights in memory nor at %s yet; waiting for its checkpoint", record.version, record.checkpoint_path)
            return
        self._waiting.pop(record.version, None)
        log.error("version %d: no weights after %.0f s (its learner died before writing %s?): marked FAILED", record.version, waited, record.checkpoint_path)
        await asyncio.to_thread(self.store.set_version_status, record.version, VersionStatus.FAILED)
        self.metrics.inc("server/swap_failures")
        self.metrics.inc("server/versions_without_weights")

    async def rollback(
        self, version: int, api_key_id: str | None = None, reason: str | None = None, segment: str | None = None
    ) -> RollbackResult:
        """Serve stored `version` again: the engine swaps atomically (drained, like any swap), then one
        store transaction marks the later versions rolled back and points the learner at `version`.
        If that transaction fails, the engine swaps back: the store and the engine never disagree.
        An adapter version rolls back its own segment only; `segment` with a base version serves that
        segment the base weights again. Raises VersionNotFound, NotServable, AlreadyServing, SwapFailed,
        UnknownSegment or the store's RollbackRefused."""
        async with self._lock:
            record = await asyncio.to_thread(self.store.get_version, version)
            if record is None:
                raise VersionNotFound(f"no policy version {version}")
            if record.segment is not None or segment is not None:
                return await self._rollback_adapter(record, segment or record.segment, api_key_id, reason)
            if not record.status.servable or not record.checkpoint_path:
                raise NotServable(f"version {version} cannot be served (status {record.status})")
            if record.pruned_at is not None:
                raise NotServable(
                    f"version {version}'s checkpoint was pruned at {record.pruned_at.isoformat()}: it cannot serve again "
                    "(pin versions you may roll back to)"
                )
            previous = self.engine.version
            if version == previous:
                raise AlreadyServing(f"version {version} is already serving")
            if version != 0 and not await asyncio.to_thread(is_checkpoint, record.checkpoint_path):  # rollbacks read durable checkpoints only
                raise NotServable(f"version {version}'s durable checkpoint is not at {record.checkpoint_path} (not written yet, or lost)")
            old = await asyncio.to_thread(self.store.get_version, previous)
            start = time.perf_counter()
            try:
                held = await self.engine.update_weights(record.checkpoint_path, version)
            except Exception as exc:
                self.metrics.inc("server/swap_failures")
                raise SwapFailed(version, f"could not load version {version}: {exc}") from exc
            try:
                rolled = await asyncio.to_thread(self.store.rollback_to, version, self.learner_name, api_key_id, reason)
            except Exception:
                log.exception("rollback to %d not recorded: swapping version %d back in", version, previous)
                await self.engine.update_weights(old.checkpoint_path, previous)
                raise
            swap_s = time.perf_counter() - start
            self.metrics.inc("server/rollbacks")
            self.metrics.observe("server/swap_hold_seconds", held)
            log.warning("rolled back from version %d to %d (rolled back: %s)", previous, version, rolled)
            return RollbackResult(version, previous, rolled, swap_s * 1000, held * 1000)

    async def _rollback_adapter(self, record: VersionRecord, segment: str, api_key_id: str | None, reason: str | None) -> RollbackResult:
        """With the lock held: serve `segment` the adapter `record` (or, for a base version, no adapter)."""
        lane = self.lane(segment)
        if record.segment is not None and record.segment != segment:
            raise NotServable(f"version {record.version} is segment {record.segment!r}'s adapter, not {segment!r}'s")
        if record.segment is None and record.version != self.engine.version:
            raise NotServable(f"version {record.version} is not the base version serving now ({self.engine.version})")
        if record.segment is not None:
            if not record.status.servable or not record.checkpoint_path or record.pruned_at is not None:
                raise NotServable(f"version {record.version} cannot be served (status {record.status}, pruned: {record.pruned_at is not None})")
        previous = self.engine.adapter_version(segment)
        if previous == record.version or (previous is None and record.segment is None):
            raise AlreadyServing(f"segment {segment!r} is already served by version {record.version}")
        old = await asyncio.to_thread(self.store.get_version, previous) if previous is not None else None
        adapter = CheckpointDir(Path(record.checkpoint_path)) if record.segment is not None else None
        start = time.perf_counter()
        try:
            held = await self.engine.update_adapter(segment, adapter, record.version)
        except Exception as exc:
            self.metrics.inc("server/swap_failures")
            raise SwapFailed(record.version, f"could not load version {record.version}: {exc}") from exc
        try:
            rolled = await asyncio.to_thread(self.store.rollback_to, record.version, lane, api_key_id, reason, segment)
        except Exception:
            log.exception("rollback of segment %s to %d not recorded: restoring its adapter", segment, record.version)
            back = CheckpointDir(Path(old.checkpoint_path)) if old is not None and old.checkpoint_path else None
            await self.engine.update_adapter(segment, back, previous if previous is not None else self.engine.version)
            raise
        self.metrics.inc("server/rollbacks")
        log.warning("segment %s rolled back from version %s to %d (rolled back: %s)", segment, previous, record.version, rolled)
        return RollbackResult(
            record.version, previous if previous is not None else self.engine.version, rolled,
            (time.perf_counter() - start) * 1000, held * 1000, segment,
        )

    async def activate_adapter(self, record: VersionRecord) -> SwapResult | None:
        """Serve a segment the adapter version its lane published; None if it is not newer or failed to load."""
        async with self._lock:
            segment = record.segment
            current = self.engine.adapter_version(segment)
            if current is not None and record.version <= current:
                return None
            start = time.perf_counter()
            try:
                held = await self.engine.update_adapter(segment, CheckpointDir(Path(record.checkpoint_path)), record.version)
            except Exception:
                log.exception("could not activate segment %s's adapter version %d", segment, record.version)
                await asyncio.to_thread(self.store.set_version_status, record.version, VersionStatus.FAILED)
                self.metrics.inc("server/swap_failures")
                return None
            await asyncio.to_thread(self.store.set_version_status, record.version, VersionStatus.SERVING)
            if current is not None:
                await asyncio.to_thread(self.store.set_version_status, current, VersionStatus.RETIRED)
            swap_s = time.perf_counter() - start
            self.metrics.observe("server/adapter_swap_seconds", swap_s, segment=segment)
            self.metrics.inc("server/adapter_swaps", segment=segment)
            return SwapResult(record.version, current if current is not None else self.engine.version, swap_s * 1000, held * 1000)

    async def _watch_adapters(self) -> None:
        """One pass of `watch` over the segments: each unpaused one gets its newest published adapter."""
        for segment in self.segments:
            if await asyncio.to_thread(self.store.learning_paused, self.lane(segment)):
                continue
            current = self.engine.adapter_version(segment)
            published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, current or -1, segment)
            for older in published[:-1]:
                await asyncio.to_thread(self.store.set_version_status, older.version, VersionStatus.SUPERSEDED)
            if published:
                done = await self.activate_adapter(published[-1])
                if done:
                    log.info("segment %s: activated adapter version %d in %.0f ms", segment, done.version, done.swap_ms)

    async def _swap(self, version: int, weights: str | WeightSource, via: str = "checkpoint_dir") -> SwapResult:
        """Swap `weights` in as `version` (its row exists); a load failure marks the row FAILED and
        raises SwapFailed (the old version keeps serving)."""
        parent = self.engine.version
        start = time.perf_counter()
        preempted = self.engine.swap_preempted
        try:
            held = await self.engine.update_weights(weights, version)
        except Exception as exc:
            await asyncio.to_thread(self.store.set_version_status, version, VersionStatus.FAILED)
            self.metrics.inc("server/swap_failures")
            raise SwapFailed(version, f"could not load version {version}: {exc}") from exc
        finally:
            self.metrics.inc("server/swap_preempted", self.engine.swap_preempted - preempted)
        await asyncio.to_thread(self.store.set_version_status, version, VersionStatus.SERVING)
        await asyncio.to_thread(self.store.set_version_status, parent, VersionStatus.RETIRED)
        swap_s = time.perf_counter() - start
        self.metrics.observe("server/swap_seconds", swap_s)
        self.metrics.observe("server/swap_seconds_by_transport", swap_s, transport=via)
        self.metrics.observe("server/swap_hold_seconds", held)
        self.metrics.inc("server/swaps")
        self.last_swap_via = via
        return SwapResult(version, parent, swap_s * 1000, held * 1000)

    async def watch(self, poll_seconds: float) -> None:
        """Activate what learners publish: the newest PUBLISHED version past the serving one
        (older published ones are SUPERSEDED). Runs until cancelled."""
        while True:
            try:
                if self.segments:
                    await self._watch_adapters()
                if await asyncio.to_thread(self.store.learning_paused, self.learner_name):
                    await asyncio.sleep(poll_seconds)
                    continue
                published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, self.engine.version)
                if published:
                    for older in published[:-1]:
                        await asyncio.to_thread(self.store.set_version_status, older.version, VersionStatus.SUPERSEDED)
                    done = await self.activate(published[-1])
                    if done:
                        log.info("activated version %d in %.0f ms (from %s)", done.version, done.swap_ms, self.last_swap_via)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("version watcher")
            await asyncio.sleep(poll_seconds)


@dataclass(frozen=True)
class StartPoint:
    """What a (re)starting server serves: `version`, started from the checkpoint `weights_path` (None:
    the base model), then, when `memory` is set, swapped to that version's weights from memory (its
    durable checkpoint is not written yet). `skipped`: newer versions passed over for having neither."""

    version: int
    weights_path: str | None
    start_version: int
    memory: WeightHandle | None = None
    skipped: tuple[int, ...] = ()


async def start_point(
    store: Store, record: VersionRecord, receiver: Receiver | None, wait_seconds: float = 0.0, poll_seconds: float = 0.5
) -> StartPoint:
    """Where to start serving `record` (the store's serving version). Its durable checkpoint when it
    exists; else its memory if a transport still holds it (started from the nearest ancestor on disk,
    then swapped); else, after waiting up to `wait_seconds` for the learner to write the checkpoint,
    the nearest ancestor with one: the passed-over versions are marked FAILED and the ancestor SERVING,
    so the store says what serves. Never a missing or half-written model."""
    if record.version == 0 or is_checkpoint(record.checkpoint_path or ""):
        return StartPoint(record.version, record.checkpoint_path if record.version else None, record.version)
    ancestor = await asyncio.to_thread(_durable_ancestor, store, record)
    base_path = ancestor.checkpoint_path if ancestor.version else None
    if receiver is not None:
        handle = receiver.handle_for(record.version, record.checkpoint_path)
        with contextlib.suppress(HandleGone):
            with receiver.open(handle):
                return StartPoint(record.version, base_path, ancestor.version, memory=handle)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(poll_seconds)
        if is_checkpoint(record.checkpoint_path or ""):
            return StartPoint(record.version, record.checkpoint_path, record.version)
    skipped: list[int] = []
    current = record
    while current.version != ancestor.version:
        skipped.append(current.version)
        await asyncio.to_thread(store.set_version_status, current.version, VersionStatus.FAILED)
        current = await asyncio.to_thread(store.get_version, current.parent)
    await asyncio.to_thread(store.set_version_status, ancestor.version, VersionStatus.SERVING)
    log.error("version %d has no weights (durable checkpoint missing, memory gone): serving version %d instead (failed: %s)",
              record.version, ancestor.version, skipped)
    return StartPoint(ancestor.version, base_path, ancestor.version, skipped=tuple(skipped))


def _durable_ancestor(store: Store, record: VersionRecord) -> VersionRecord:
    """The nearest ancestor of `record` whose durable checkpoint exists (version 0, the base, at worst)."""
    current = record
    while current.version != 0 and current.parent is not None:
        parent = store.get_version(current.parent)
        if parent is None:
            break
        current = parent
        if current.version == 0 or is_checkpoint(current.checkpoint_path or ""):
            return current
    base = store.get_version(0)
    assert base is not None, "version 0 (the base model) always exists"
    return base


async def finish_start(publisher: Publisher, point: StartPoint) -> None:
    """After `engine.start(point.start_version, point.weights_path)`: swap to the version's memory."""
    if point.memory is None or publisher.receiver is None:
        return
    with publisher.receiver.open(point.memory) as source:
        await publisher.engine.update_weights(source, point.version)
