"""Publishing a policy version into the live engine. The store owns version state (store/lifecycle.py):
the publisher changes no status itself, it asks the store and acts on the answer.

One activation path (`_activate`) for every version, base weights or a segment's adapter, a learner's
or an operator's, under the publisher's lock: (1) the store is asked whether the version may serve now
(`Store.check_activation`: re-read under the lock; published or loading, not pruned, descending from
the lineage's serving version); (2) the engine swaps it in (drained and atomic; an adapter: for its
segment only); (3) one store transaction checks again and makes it SERVING, the old version RETIRED and
the published versions it overtook SUPERSEDED. An activation that lost a race (a rollback, an
operator's publish, a learner giving the version up) is dropped with a log line, a counter and an
operator event, never applied; one refused after the swap swaps the old version back. A failed swap
leaves the old version serving and the row FAILED.

An operator's checkpoint (`publish_dir`, copied into the learner's checkpoint_dir and checked first:
server/control/weights_import.py) gets its row first, as LOADING, under the number its copy is then moved to (a
response that records the new version always has its row), then the same path; it becomes the
learner's lineage: the learner's cursor moves to it in step (3), so a learner publish on the old parent
is refused by the store's lineage check and the learner reloads, as after a rollback. Learners write
their own rows (status PUBLISHED); `watch` activates them, unless the operator paused learning.
`rollback` swaps a stored version back in, then records it (`Store.rollback_to`).

With adapters on (`segments` non-empty) each segment has its own lineage of adapter versions over the
frozen base: `watch` activates a segment's newest published adapter into the engine for that segment
only (no drain: running responses keep the adapter they started with), `rollback` of an adapter version
moves that segment alone, and a segment can go back to the base weights (rollback to a base version
with `segment` given). A segment's pause holds back only its own activations.

Results are typed (`SwapResult`, `RollbackResult`); refusals are domain exceptions (`CheckpointUnusable`,
`VersionNotFound`, `NotServable`, `AlreadyServing`, `SwapFailed`, the store's `RollbackRefused` and
`TransitionRefused`) that the HTTP edge maps to statuses (server/edge/errors.py) and the background guard logs.

Weights come through the transport seam (liveloop/transport): with a `receiver`, `activate` reads a
published version from memory first (the learner sent it before recording the row, and writes the
durable checkpoint after, off the critical path), then from its checkpoint directory. A version whose
memory is gone and whose durable checkpoint is not written yet stays PUBLISHED and is tried again at the
next poll, for up to `durable_wait_seconds`; after that it is marked FAILED (its learner died before
writing it: the learner's resume rolls its lineage back), and the old version keeps serving. Nothing
ever serves a half-written or missing model. Weights are verified against their row before they serve
(the memory's nonce and digest, the checkpoint's sha256; see liveloop/transport/base.py): on a
mismatch nothing swaps, the version serving keeps serving, and the row becomes FAILED with a
"weights_rejected" event (`server/weights_rejected`). A checkpoint directory is verified by copying it
(`verified_copy`: every file, config and tokenizer included, hashed as it is copied into a private
directory) and the engine loads that copy, removed after the swap: never the shared directory again. After a swap the receiver frees the memory of older
versions (and the new version's own once its durable checkpoint exists). Rollbacks and restarts read
durable checkpoints only; start-up recovery (what a restarting server serves when the serving version's
durable checkpoint is missing) is server/control/startup.py's.

Several replicas (Ray Serve, liveloop/serve_ray.py) share one store, and each has its own publisher.
The store's serving version is what every replica serves: `follow` (the follower rule, run first in
each `watch` pass, paused or not) swaps this replica's engine to the store's serving version of each
lineage (the base, and each segment's adapter) whenever they differ, with the same weights path and
verification as an activation but no status change. So the replica that activated a version, rolled
back or imported one brings the others with it within a watch interval, a replica never serves what
the store does not say serves (but for that delay), and it never moves to an older version unless the
store rolled back to it (the store's serving version only goes back by a rollback). Two replicas that
activate the same published version race in the store: the one whose transaction comes second finds
it SERVING already and keeps it (no drop, no swap back). With `keep_serving_memory` (a fleet), a
replica's `loaded` keeps the serving version's own memory for the replicas still swapping it in; the
next version's `loaded` (or the sender's `keep_versions`) frees it.

Under a release gate (`[release] mode` canary or gated; server/control/gate.py decides, the engine is a
`CanaryEngine`) `watch` activates nothing of a gated lineage: the base's (`gate_base`) nor the gated
segments' (`gate_segments`). The gate's candidates are loaded, promoted and dropped by
server/control/candidates.py, under this publisher's lock and with its weights path and verification. A
follower whose candidate engine (or a segment's candidate slot) already holds the version another
replica promoted promotes it locally instead of loading it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from liveloop.metrics import Metrics
from liveloop.server.engines.base import Engine
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.control.settled import Changes
from liveloop.transport.weights import CheckpointDir, WeightSource
from liveloop.server.control.weights_import import StagedCheckpoint
from liveloop.store import ServingChanged, Store, TransitionRefused, VersionNotFound, VersionRecord, VersionStatus
from liveloop.transport import HandleGone, Receiver, WeightHandle, WeightsUnverified
from liveloop.transport.checkpoint_dir import is_checkpoint, verified_copy

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
        keep_serving_memory: bool = False,
        gate_base: bool = False,
        gate_segments: tuple[str, ...] = (),
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
        self.keep_serving_memory = keep_serving_memory  # other replicas still read the serving version's memory
        self._unfollowable: set[int] = set()  # serving versions whose weights failed verification here
        # the release gate (server/control/gate.py) decides what of the base lineage serves: `watch` activates none of it
        self.gate_base = gate_base
        self.gate_segments = frozenset(gate_segments)  # and of these segments' adapter lineages
        self._lock = asyncio.Lock()
        self.changes = Changes()  # the swap-to-record windows; admin views read between them

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

    async def publish_dir(self, checkpoint: StagedCheckpoint, note: str | None = None, **row: object) -> SwapResult:
        """Serve an operator's checkpoint, copied and checked into managed storage already
        (server/control/weights_import.py), as the next version: its row first, as LOADING, with the copy moved
        under the version's name (`StagedCheckpoint.record`), then the activation path every version
        takes. The operator's version becomes the learner's lineage (its cursor moves there, as after a
        rollback). Raises CheckpointUnusable when the engine cannot load it (the row becomes FAILED),
        the import's ImportFailed, the store's TransitionRefused if the store no longer agrees with the
        engine on what serves."""
        async with self._lock:
            record = await asyncio.to_thread(checkpoint.record, self.store, self.engine.version, note, **row)
            try:
                result = await self._activate(record.version, operator=True)
            except SwapFailed as exc:
                raise CheckpointUnusable(checkpoint.source, f"could not load {checkpoint.source}: {exc.__cause__}") from exc
            assert result is not None  # an operator's activation raises rather than returning None
            return result

    async def activate(self, record: VersionRecord) -> SwapResult | None:
        """Swap in a version a learner published (base weights or a segment's adapter), from memory
        when its transport still holds it, else from its checkpoint directory. None if it is not newer,
        failed to load, its weights are not there yet (it is tried again at the next poll), or it lost
        a race: the store, asked under the lock, says it may not serve now (rolled back, off its
        lineage, something newer serves); such an activation is dropped, never applied."""
        async with self._lock:
            return await self._activate(record.version)

    def _serving_in(self, segment: str | None) -> int | None:
        """What the engine serves in a lineage: the base version, or a segment's adapter (None: none)."""
        return self.engine.version if segment is None else self.engine.adapter_version(segment)

    async def _activate(self, version: int, operator: bool = False) -> SwapResult | None:
        """THE activation path, with the lock held: the store's word first (the row re-read and checked
        under the lock), then the engine swap, then the store's transaction that checks again and makes
        it SERVING. A refusal before the swap drops it; one after swaps the old version back. For an
        operator's publish (`operator`) refusals raise instead, and its row is marked FAILED."""
        try:
            record = await asyncio.to_thread(self.store.check_activation, version)
        except TransitionRefused as exc:
            if operator:
                await self._fail(version)
                raise
            if not await self._serves_now(version):  # another replica activated it: `follow` swaps it in
                await self._drop(version, str(exc))
            return None
        current = self._serving_in(record.segment)
        if not operator and current is not None and version <= current:
            return None
        with contextlib.ExitStack() as window:  # from the swap to the store's word on it (server/control/settled.py)
            with contextlib.ExitStack() as stack:
                try:  # the weights are verified against the row (nonce, digest) before anything serves
                    if operator or record.segment is not None:
                        copy = await asyncio.to_thread(verified_copy, record.checkpoint_path, record.checkpoint_sha256, version)
                        source, via, handle = CheckpointDir(stack.enter_context(copy).path), "checkpoint_dir", None
                    else:
                        source, via, handle = await asyncio.to_thread(self._open, record, stack)
                except WeightsUnverified as exc:
                    await self._reject(record, exc)
                    if operator:
                        raise SwapFailed(version, f"version {version}'s weights failed verification") from exc
                    return None
                if source is None:
                    await self._wait_for_weights(record)
                    return None
                self._waiting.pop(version, None)
                window.enter_context(self.changes.changing())
                try:
                    result = await self._swap(record, source, via)
                except SwapFailed:
                    if operator:
                        raise
                    log.exception("could not activate version %d", version)
                    return None
            try:
                activation = await asyncio.to_thread(self.store.activate_version, version, self.lane(record.segment) if operator else None)
            except TransitionRefused as exc:  # lost a race after the swap (a writer outside this lock): undo it
                if not operator and await self._serves_now(version):  # another replica activated it first: it serves
                    await self._loaded(record, handle)
                    return result
                await self._swap_back(record, current)
                if operator:
                    await self._fail(version)
                    raise
                await self._drop(version, str(exc))
                return None
        if activation.superseded:
            log.info("version %d superseded %s", version, activation.superseded)
        if not operator:
            await self._loaded(record, handle)
        return result

    async def _serves_now(self, version: int) -> bool:
        """Whether the store says `version` serves its lineage now (another replica activated it)."""
        record = await asyncio.to_thread(self.store.get_version, version)
        return record is not None and record.status == VersionStatus.SERVING

    async def _loaded(self, record: VersionRecord, handle: WeightHandle | None) -> None:
        """The transport may free what no replica needs now that `record` serves here: older versions'
        memory, and its own once durable (kept while other replicas may still read it)."""
        if self.receiver is None or record.segment is not None:
            return
        durable = not self.keep_serving_memory and await asyncio.to_thread(is_checkpoint, record.checkpoint_path or "")
        await asyncio.to_thread(self.receiver.loaded, handle or self._handle(record), durable)

    async def _swap(self, record: VersionRecord, weights: WeightSource, via: str) -> SwapResult:
        """The engine swap of a checked version: the base weights (drained) or a segment's adapter. A load
        failure marks the row FAILED and raises SwapFailed (the old version keeps serving)."""
        segment = record.segment
        previous = self._serving_in(segment)
        start = time.perf_counter()
        preempted = self.engine.swap_preempted
        try:
            if segment is None:
                held = await self.engine.update_weights(weights, record.version)
            else:
                held = await self.engine.update_adapter(segment, weights, record.version)
        except Exception as exc:
            await self._fail(record.version)
            self.metrics.inc("server/swap_failures")
            raise SwapFailed(record.version, f"could not load version {record.version}: {exc}") from exc
        finally:
            self.metrics.inc("server/swap_preempted", self.engine.swap_preempted - preempted)
        swap_s = time.perf_counter() - start
        if segment is None:
            self.metrics.observe("server/swap_seconds", swap_s)
            self.metrics.observe("server/swap_seconds_by_transport", swap_s, transport=via)
            self.metrics.observe("server/swap_hold_seconds", held)
            self.metrics.inc("server/swaps")
            self.last_swap_via = via
        else:
            self.metrics.observe("server/adapter_swap_seconds", swap_s, segment=segment)
            self.metrics.inc("server/adapter_swaps", segment=segment)
        parent = previous if previous is not None else self.engine.version
        return SwapResult(record.version, parent, swap_s * 1000, held * 1000)

    async def _swap_back(self, record: VersionRecord, previous: int | None) -> None:
        """The store refused `record` after the engine swapped it in: serve `previous` again."""
        old = await asyncio.to_thread(self.store.get_version, previous) if previous is not None else None
        try:
            if record.segment is not None:
                back = CheckpointDir(Path(old.checkpoint_path)) if old is not None and old.segment is not None and old.checkpoint_path else None
                await self.engine.update_adapter(record.segment, back, previous if previous is not None else self.engine.version)
                return
            with contextlib.ExitStack() as stack:
                source = (await asyncio.to_thread(self._open, old, stack))[0] if old is not None else None
                if source is None and previous == 0 and old is not None and old.checkpoint_path:
                    source = CheckpointDir(Path(old.checkpoint_path))
                if source is None:
                    raise SwapFailed(previous or 0, f"no weights for version {previous}")
                await self.engine.update_weights(source, previous)
        except Exception:
            self.metrics.inc("server/swap_failures")
            log.critical("version %d was refused after it swapped in, and version %s could not be swapped back", record.version, previous, exc_info=True)

    async def _fail(self, version: int) -> None:
        """Mark `version` FAILED (unless it is already)."""
        try:
            await asyncio.to_thread(self.store.fail_version, version)
        except TransitionRefused:
            pass

    async def _reject(self, record: VersionRecord, exc: WeightsUnverified) -> None:
        """The weights found for `record` are not the ones its row names: nothing of them served; the
        serving version keeps serving, the row becomes FAILED with a "weights_rejected" event."""
        log.error("version %d: weights rejected (%s): version %s keeps serving", record.version, exc, self._serving_in(record.segment))
        self.metrics.inc("server/weights_rejected")
        detail = {"reason": str(exc), "serving": self._serving_in(record.segment)}
        await asyncio.to_thread(self.store.reject_weights, record.version, detail)

    async def _drop(self, version: int, reason: str) -> None:
        """An activation that lost a race: logged, counted, recorded by the store; never applied."""
        log.warning("activation of version %d dropped: %s", version, reason)
        self.metrics.inc("server/activations_dropped")
        await asyncio.to_thread(self.store.drop_activation, version, reason)

    def _handle(self, record: VersionRecord) -> WeightHandle:
        assert self.receiver is not None
        return self.receiver.handle_of(record)  # the row's nonce and digest: what `open` verifies against

    def _open(self, record: VersionRecord, stack: contextlib.ExitStack) -> tuple[WeightSource | None, str, WeightHandle | None]:
        """The version's weights: its transport's memory first, then its durable checkpoint directory,
        each verified against the row (WeightsUnverified); (None, ...) when neither is there. A durable
        checkpoint counts once the row names its digest (an in-memory publish records it after fsync);
        what is returned of it is its verified private copy, removed when `stack` closes."""
        if self.receiver is not None:
            try:
                handle = self._handle(record)
                return stack.enter_context(self.receiver.open(handle)), self.receiver.backend, handle
            except HandleGone as exc:
                log.debug("version %d: %s; trying its checkpoint directory", record.version, exc)
        if record.checkpoint_path and is_checkpoint(record.checkpoint_path):
            if record.weights_digest and not record.checkpoint_sha256:
                return None, "", None  # being written: its digest is recorded once it is durable
            copy = stack.enter_context(verified_copy(record.checkpoint_path, record.checkpoint_sha256, record.version))
            return CheckpointDir(copy.path), "checkpoint_dir", None  # the copy that was hashed, removed with `stack`
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
        await self._fail(record.version)
        self.metrics.inc("server/swap_failures")
        self.metrics.inc("server/versions_without_weights")

    async def rollback(
        self, version: int, api_key_id: str | None = None, reason: str | None = None, segment: str | None = None,
        expect_serving: int | None = None, event: tuple[str, dict] | None = None, term: int | None = None,
    ) -> RollbackResult:
        """Serve stored `version` again: the engine swaps atomically (drained, like any swap), then one
        store transaction marks the later versions rolled back and points the learner at `version`.
        If that transaction fails, the engine swaps back: the store and the engine never disagree.
        An adapter version rolls back its own segment only; `segment` with a base version serves that
        segment the base weights again. With `expect_serving` (the version the operator saw serving that
        lineage) it is refused, before anything swaps and again in the store's transaction, when another
        serves now (ServingChanged). Raises VersionNotFound, NotServable, AlreadyServing, SwapFailed,
        UnknownSegment or the store's RollbackRefused. `event` (kind, detail): an operator event recorded
        in the rollback's own transaction (the guard's verdict). `term`: the leader lease's term a leader's
        rollback carries (store/lease.py `fenced`; None: an operator's, unfenced): a deposed leader's is
        refused in the store's transaction (StaleLeader) and the engine swaps back."""
        async with self._lock:
            record = await asyncio.to_thread(self.store.get_version, version)
            if record is None:
                raise VersionNotFound(f"no policy version {version}")
            if record.segment is not None or segment is not None:
                return await self._rollback_adapter(record, segment or record.segment, api_key_id, reason, expect_serving, event, term)
            if expect_serving is not None and expect_serving != self.engine.version:
                raise ServingChanged(f"version {expect_serving} no longer serves (now: v{self.engine.version})")
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
            try:  # the engine loads the copy that was hashed
                copy = await asyncio.to_thread(verified_copy, record.checkpoint_path, record.checkpoint_sha256, version)
            except WeightsUnverified as exc:
                await self._reject(record, exc)
                raise NotServable(f"version {version}'s checkpoint is not the one its row names: {exc}") from exc
            old = await asyncio.to_thread(self.store.get_version, previous)
            start = time.perf_counter()
            with copy, self.changes.changing():
                try:
                    held = await self.engine.update_weights(CheckpointDir(copy.path), version)
                except Exception as exc:
                    self.metrics.inc("server/swap_failures")
                    raise SwapFailed(version, f"could not load version {version}: {exc}") from exc
                try:
                    rolled = await asyncio.to_thread(self.store.rollback_to, version, self.learner_name, api_key_id, reason, None, expect_serving, event, term)
                except Exception:
                    log.exception("rollback to %d not recorded: swapping version %d back in", version, previous)
                    await self.engine.update_weights(old.checkpoint_path, previous)
                    raise
            swap_s = time.perf_counter() - start
            self.metrics.inc("server/rollbacks")
            self.metrics.observe("server/swap_hold_seconds", held)
            log.warning("rolled back from version %d to %d (rolled back: %s)", previous, version, rolled)
            return RollbackResult(version, previous, rolled, swap_s * 1000, held * 1000)

    async def _rollback_adapter(
        self, record: VersionRecord, segment: str, api_key_id: str | None, reason: str | None, expect_serving: int | None,
        event: tuple[str, dict] | None, term: int | None = None,
    ) -> RollbackResult:
        """With the lock held: serve `segment` the adapter `record` (or, for a base version, no adapter)."""
        lane = self.lane(segment)
        seen = self.engine.adapter_version(segment)
        if expect_serving is not None and expect_serving != (seen if seen is not None else self.engine.version):
            raise ServingChanged(f"version {expect_serving} no longer serves segment {segment!r}")
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
        with self.changes.changing():
            try:
                held = await self.engine.update_adapter(segment, adapter, record.version)
            except Exception as exc:
                self.metrics.inc("server/swap_failures")
                raise SwapFailed(record.version, f"could not load version {record.version}: {exc}") from exc
            try:
                rolled = await asyncio.to_thread(self.store.rollback_to, record.version, lane, api_key_id, reason, segment, expect_serving, event, term)
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

    async def _watch_adapters(self) -> None:
        """One pass of `watch` over the segments: each unpaused one gets its newest published adapter."""
        for segment in self.segments:
            if segment in self.gate_segments or await asyncio.to_thread(self.store.learning_paused, self.lane(segment)):
                continue
            current = self.engine.adapter_version(segment)
            published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, current or -1, segment)
            if published:
                done = await self.activate(published[-1])
                if done:
                    log.info("segment %s: activated adapter version %d in %.0f ms", segment, done.version, done.swap_ms)

    async def follow(self) -> list[SwapResult]:
        """The follower rule: swap this replica's engine to the store's serving version of each lineage
        (the base weights, each segment's adapter) where they differ, verified as every activation is,
        with no status change (the store says it serves already). A version whose weights are not
        readable yet (memory gone, durable checkpoint still being written) is tried again at the next
        pass; one whose weights fail verification is not tried again while it serves (an event records
        it). Returns the swaps made."""
        async with self._lock:
            done = []
            record = await asyncio.to_thread(self.store.latest_version)
            if record is not None and record.version != self.engine.version and record.version not in self._unfollowable:
                result = await self._follow_base(record)
                if result is not None:
                    done.append(result)
            if self.segments:
                done.extend(await self._follow_adapters())
            return done

    async def _follow_base(self, record: VersionRecord) -> SwapResult | None:
        if isinstance(self.engine, CanaryEngine) and self.engine.candidate_version == record.version:
            previous = self.engine.version  # another replica promoted the candidate this one holds: no load
            self.engine.promote()
            self.metrics.inc("server/follows")
            log.info("followed the store to version %d (from %d): the candidate here, promoted", record.version, previous)
            return SwapResult(record.version, previous, 0.0, 0.0)
        with contextlib.ExitStack() as stack:
            try:
                source, via, handle = await asyncio.to_thread(self._open, record, stack)
                if source is None and record.version == 0 and record.checkpoint_path:  # the base model's directory
                    source, via, handle = CheckpointDir(Path(record.checkpoint_path)), "checkpoint_dir", None
            except WeightsUnverified as exc:
                self._unfollowable.add(record.version)
                await self._reject(record, exc)
                return None
            if source is None:
                log.debug("version %d serves, but its weights are not readable here yet", record.version)
                return None
            try:
                result = await self._swap(record, source, via)
            except SwapFailed:
                log.exception("could not follow the store to version %d", record.version)
                return None
        self.metrics.inc("server/follows")
        log.info("followed the store to version %d (from %d) in %.0f ms via %s", record.version, result.parent, result.swap_ms, via)
        await self._loaded(record, handle)
        return result

    async def _follow_adapters(self) -> list[SwapResult]:
        """Each segment's adapter as the store says it serves (none: the base weights serve it)."""
        serving = await asyncio.to_thread(self.store.serving_adapters)
        done = []
        for segment in self.segments:
            record = serving.get(segment)
            current = self.engine.adapter_version(segment)
            if record is None:
                if current is None:
                    continue
                start = time.perf_counter()
                held = await self.engine.update_adapter(segment, None, self.engine.version)
                done.append(SwapResult(self.engine.version, current, (time.perf_counter() - start) * 1000, held * 1000))
                log.info("segment %s: followed the store back to the base weights (from adapter %d)", segment, current)
                continue
            if record.version == current or record.version in self._unfollowable or not record.checkpoint_path:
                continue
            if isinstance(self.engine, CanaryEngine) and self.engine.candidate_adapter_version(segment) == record.version:
                await self.engine.promote_adapter(segment)  # another replica promoted the candidate this one holds
                done.append(SwapResult(record.version, current if current is not None else self.engine.version, 0.0, 0.0))
                self.metrics.inc("server/follows")
                log.info("segment %s: followed the store to adapter version %d: the candidate here, promoted", segment, record.version)
                continue
            try:
                copy = await asyncio.to_thread(verified_copy, record.checkpoint_path, record.checkpoint_sha256, record.version)
            except WeightsUnverified as exc:
                self._unfollowable.add(record.version)
                await self._reject(record, exc)
                continue
            try:
                with copy:
                    done.append(await self._swap(record, CheckpointDir(copy.path), "checkpoint_dir"))
            except SwapFailed:
                log.exception("segment %s: could not follow the store to adapter %d", segment, record.version)
                continue
            self.metrics.inc("server/follows")
            log.info("segment %s: followed the store to adapter version %d", segment, record.version)
        return done

    async def watch(self, poll_seconds: float) -> None:
        """Each pass: follow the store's serving versions (`follow`: what another replica activated or
        rolled back), then activate what learners publish: the newest PUBLISHED version past the
        serving one (its activation supersedes the older published ones), unless learning is paused.
        Runs until cancelled."""
        while True:
            try:
                await self.follow()
                if self.segments:
                    await self._watch_adapters()
                if self.gate_base or await asyncio.to_thread(self.store.learning_paused, self.learner_name):
                    await asyncio.sleep(poll_seconds)
                    continue
                published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, self.engine.version)
                if published:
                    done = await self.activate(published[-1])
                    if done:
                        log.info("activated version %d in %.0f ms (from %s)", done.version, done.swap_ms, self.last_swap_via)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("version watcher")
            await asyncio.sleep(poll_seconds)
