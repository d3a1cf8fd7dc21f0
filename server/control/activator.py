"""What serves in this replica's engine, and the one path that changes it. The store owns version state
(store/lifecycle.py): the activator changes no status itself, it asks the store and acts on the answer.
(Publishing is the learner's job, learner/publishing.py: it writes versions; the activator decides
when one serves here.)

Every change of what the engine serves, for either kind of lineage (`Lineage`: the base weights or a
segment's adapter), goes through one swap-then-record-or-swap-back path (`Activator.change`, and
`switch` for a load of verified weights): the engine swaps, then the store's transaction records it;
when the store refuses, the engine swaps back to what served (its weights verified as any load's).
Activation, rollback, the follower rule, start-up, the gate's promotions (server/control/candidates.py)
and forget-to-weights (through `rollback`) all take it, under the activator's lock. Weights come from
one place (`weights`): memory first, then the durable checkpoint's verified private copy.

One activation path (`_activate`) for every version, base weights or a segment's adapter, a learner's
or an operator's, under the activator's lock: (1) the store is asked whether the version may serve now
(`store.versions.check_activation`: re-read under the lock; published or loading, not pruned, descending from
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
`rollback` swaps a stored version back in (verified), then records it (`store.versions.rollback_to`).

With adapters on (`segments` non-empty) each segment has its own lineage of adapter versions over the
frozen base: `watch` activates a segment's newest published adapter into the engine for that segment
only (no drain: running responses keep the adapter they started with), `rollback` of an adapter version
moves that segment alone, and a segment can go back to the base weights (rollback to a base version
with `segment` given). A segment's pause holds back only its own activations.

Results are typed (`SwapResult`, `RollbackResult`); refusals are domain exceptions (`CheckpointUnusable`,
`VersionNotFound`, `NotServable`, `AlreadyServing`, `SwapFailed`, the store's `RollbackRefused` and
`TransitionRefused`) that the HTTP edge maps to statuses (server/edge/errors.py) and the background guard logs.

The watcher (`watch`) looks every `[server] watch_seconds`, and at once when a co-located learner rings
the transport's bell at a publish (liveloop/transport/bell.py; `[transport] bell`): the version serves
about a swap after its row is written, not a poll interval later. Each learner activation logs where its
time went (`_timeline`: the publish until the watcher looked, the store's word, the weights, the swap,
the record; metric `server/publish_to_serve_seconds`).

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

Several replicas (Ray Serve, liveloop/serve_ray.py) share one store, and each has its own activator.
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
server/control/candidates.py, under this activator's lock and with its weights path and verification. A
follower whose candidate engine (or a segment's candidate slot) already holds the version another
replica promoted promotes it locally instead of loading it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from liveloop.metrics import Metrics
from liveloop.segments import BASE, Lineage
from liveloop.server.engines.base import Engine
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.control.settled import Changes
from liveloop.transport.weights import CheckpointDir, WeightSource
from liveloop.server.control.weights_import import StagedCheckpoint
from liveloop.store import ServingChanged, Store, TransitionRefused, VersionNotFound, VersionRecord, VersionStatus
from liveloop.transport import HandleGone, Receiver, WeightHandle, WeightsUnverified
from liveloop.transport.checkpoint_dir import is_checkpoint, verified_copy

log = logging.getLogger(__name__)
T = TypeVar("T")

RING_RETRY_SECONDS = 0.002  # after a ring, how soon the watcher looks again for the rung version's row (then doubling)
RING_PATIENCE_SECONDS = 0.25  # and for how long (then its polls find it, or it was never recorded)


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


class Activator:
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
        self.lock = asyncio.Lock()  # one change of what serves at a time (the gate's candidates take it too)
        self.changes = Changes()  # the swap-to-record windows; admin views read between them
        self.looked_at = 0.0  # when the watcher's last pass began (wall clock)

    # -- lineages -------------------------------------------------------------------------------------
    def lineage(self, segment: str | None) -> Lineage:
        """The lineage of the base weights (None) or of a segment this server has adapters for."""
        if segment is not None and segment not in self.segments:
            raise UnknownSegment(f"segment {segment!r} has no adapters here (segments: {', '.join(self.segments) or 'none'})")
        return Lineage(segment)

    def lane(self, segment: str | None) -> str:
        """The learner_cursor / learner_control name of a lineage (`sao`, or `sao:cozy`)."""
        return self.lineage(segment).lane(self.learner_name)

    def serving_in(self, lineage: Lineage) -> int | None:
        """What the engine serves in a lineage: the base version, or a segment's adapter (None: none,
        the base weights serve the segment)."""
        return self.engine.version if lineage.is_base else self.engine.adapter_version(lineage.segment)

    def serving_adapters(self) -> dict[str, int | None]:
        """Each segment's serving adapter version (None: the base weights serve it)."""
        return {segment: self.engine.adapter_version(segment) for segment in self.segments}

    @property
    def serving_version(self) -> int:
        """The version the engine serves now."""
        return self.engine.version

    # -- weights: one place, always verified -------------------------------------------------------------
    def weights(self, record: VersionRecord, stack: contextlib.ExitStack, memory: bool = True) -> tuple[WeightSource | None, str, WeightHandle | None]:
        """The version's weights, verified against its row (WeightsUnverified): for the base lineage its
        transport's memory first (`memory`), then its durable checkpoint; a segment's adapter from its
        checkpoint. What a checkpoint gives is its verified private copy, removed when `stack` closes.
        (None, ...) when nothing is there yet. A durable base checkpoint counts once the row names its
        digest (an in-memory publish records it after fsync); version 0 with no digest is the configured
        model's own directory."""
        found = self._find(record, stack, memory)
        if found[0] is not None:
            self._waiting.pop(record.version, None)
        return found

    def _find(self, record: VersionRecord, stack: contextlib.ExitStack, memory: bool) -> tuple[WeightSource | None, str, WeightHandle | None]:
        lineage = Lineage.of(record)
        if lineage.is_base and memory and self.receiver is not None:
            try:
                handle = self._handle(record)
                return stack.enter_context(self.receiver.open(handle)), self.receiver.backend, handle
            except HandleGone as exc:
                log.debug("version %d: %s; trying its checkpoint directory", record.version, exc)
        path = record.checkpoint_path
        if path and (not lineage.is_base or is_checkpoint(path)):
            if lineage.is_base and record.weights_digest and not record.checkpoint_sha256:
                return None, "", None  # being written: its digest is recorded once it is durable
            copy = stack.enter_context(verified_copy(path, record.checkpoint_sha256, record.version))
            return CheckpointDir(copy.path), "checkpoint_dir", None  # the copy that was hashed, removed with `stack`
        if record.version == 0 and path:  # the configured model's directory
            return CheckpointDir(Path(path)), "checkpoint_dir", None
        return None, "", None

    def _handle(self, record: VersionRecord) -> WeightHandle:
        assert self.receiver is not None
        return self.receiver.handle_of(record)  # the row's nonce and digest: what `open` verifies against

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
            old = await asyncio.to_thread(self.store.versions.get_version, previous) if previous is not None else None
            if not lineage.is_base and (old is None or old.segment is None):
                await self.engine.update_adapter(lineage.segment, None, self.engine.version)
                return
            if old is None:
                raise SwapFailed(previous or 0, f"no row for version {previous}")
            with contextlib.ExitStack() as stack:
                source, _, _ = await asyncio.to_thread(self.weights, old, stack)
                if source is None:
                    raise SwapFailed(old.version, f"no weights for version {old.version}")
                await self._load(lineage, source, old.version, fail_row=False)
        except Exception:
            self.metrics.inc("server/swap_failures")
            log.critical("version %d was refused after it swapped in, and version %s could not be swapped back", version, previous, exc_info=True)

    # -- what the other paths share (the gate's candidates use them too) ----------------------------------
    async def serves_now(self, version: int) -> bool:
        """Whether the store says `version` serves its lineage now (another replica activated it)."""
        record = await asyncio.to_thread(self.store.versions.get_version, version)
        return record is not None and record.status == VersionStatus.SERVING

    async def loaded(self, record: VersionRecord, handle: WeightHandle | None) -> None:
        """The transport may free what no replica needs now that `record` serves here: older versions'
        memory, and its own once durable (kept while other replicas may still read it)."""
        if self.receiver is None or not Lineage.of(record).is_base:
            return
        durable = not self.keep_serving_memory and await asyncio.to_thread(is_checkpoint, record.checkpoint_path or "")
        await asyncio.to_thread(self.receiver.loaded, handle or self._handle(record), durable)

    async def fail(self, version: int) -> None:
        """Mark `version` FAILED (unless it is already)."""
        try:
            await asyncio.to_thread(self.store.versions.fail_version, version)
        except TransitionRefused:
            pass

    async def reject(self, record: VersionRecord, exc: WeightsUnverified) -> None:
        """The weights found for `record` are not the ones its row names: nothing of them served; the
        serving version keeps serving, the row becomes FAILED with a "weights_rejected" event."""
        serving = self.serving_in(Lineage.of(record))
        log.error("version %d: weights rejected (%s): version %s keeps serving", record.version, exc, serving)
        self.metrics.inc("server/weights_rejected")
        await asyncio.to_thread(self.store.versions.reject_weights, record.version, {"reason": str(exc), "serving": serving})

    async def drop(self, version: int, reason: str) -> None:
        """An activation that lost a race: logged, counted, recorded by the store; never applied."""
        log.warning("activation of version %d dropped: %s", version, reason)
        self.metrics.inc("server/activations_dropped")
        await asyncio.to_thread(self.store.versions.drop_activation, version, reason)

    async def wait_for_weights(self, record: VersionRecord) -> None:
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
        await self.fail(record.version)
        self.metrics.inc("server/swap_failures")
        self.metrics.inc("server/versions_without_weights")

    # -- activation ------------------------------------------------------------------------------------
    async def activate_import(self, checkpoint: StagedCheckpoint, note: str | None = None, **row: object) -> SwapResult:
        """Serve an operator's checkpoint, copied and checked into managed storage already
        (server/control/weights_import.py), as the next version: its row first, as LOADING, with the copy
        moved under the version's name (`StagedCheckpoint.record`), then the activation path every version
        takes. The operator's version becomes the learner's lineage (its cursor moves there, as after a
        rollback). Raises CheckpointUnusable when the engine cannot load it (the row becomes FAILED),
        the import's ImportFailed, the store's TransitionRefused if the store no longer agrees with the
        engine on what serves."""
        async with self.lock:
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
        async with self.lock:
            return await self._activate(record.version)

    async def _activate(self, version: int, operator: bool = False) -> SwapResult | None:
        """THE activation, with the lock held: the store's word first (the row re-read and checked under
        the lock), then `switch` (the engine swap, then the store's transaction that checks again and
        makes it SERVING; refused there, the old version swaps back). A refusal before the swap drops
        it. For an operator's publish (`operator`) refusals raise instead, and its row is marked FAILED."""
        began = time.time()
        try:
            record = await asyncio.to_thread(self.store.versions.check_activation, version)
        except TransitionRefused as exc:
            if operator:
                await self.fail(version)
                raise
            if not await self.serves_now(version):  # another replica activated it: `follow` swaps it in
                await self.drop(version, str(exc))
            return None
        lineage = Lineage.of(record)
        current = self.serving_in(lineage)
        if not operator and current is not None and version <= current:
            return None

        async def commit() -> Any:
            try:
                return await asyncio.to_thread(self.store.versions.activate_version, version, lineage.lane(self.learner_name) if operator else None)
            except TransitionRefused:
                if not operator and await self.serves_now(version):  # another replica activated it first: it serves
                    return None
                raise

        checked = time.time()
        with contextlib.ExitStack() as stack:
            try:  # the weights are verified against the row (nonce, digest) before anything serves
                source, via, handle = await asyncio.to_thread(self.weights, record, stack, not operator)
            except WeightsUnverified as exc:
                await self.reject(record, exc)
                if operator:
                    raise SwapFailed(version, f"version {version}'s weights failed verification") from exc
                return None
            opened = time.time()
            if source is None:
                if operator:
                    await self.fail(version)
                    raise SwapFailed(version, f"version {version} has no weights at {record.checkpoint_path}")
                await self.wait_for_weights(record)
                return None
            try:
                result, activation = await self.switch(lineage, version, source, via, commit)
            except SwapFailed:
                if operator:
                    raise
                log.exception("could not activate version %d", version)
                return None
            except TransitionRefused as exc:  # lost a race after the swap (a writer outside this lock): swapped back
                if operator:
                    await self.fail(version)
                    raise
                await self.drop(version, str(exc))
                return None
        if activation is not None and activation.superseded:
            log.info("version %d superseded %s", version, activation.superseded)
        if not operator:
            switched = time.time()
            await self.loaded(record, handle)
            self._timeline(record, began, checked, opened, switched, result)
        return result

    def _timeline(self, record: VersionRecord, began: float, checked: float, opened: float, switched: float, result: SwapResult) -> None:
        """How long a published version took to serve here, by stage (wall clock: the row's created_at is
        the learner's publish, on the same machine): the metric `server/publish_to_serve_seconds` and one
        log line (bench/feedback_to_live.py reads it for its timeline)."""
        now = time.time()
        published = record.created_at.timestamp()
        looked = self.looked_at if self.looked_at >= published else began
        self.metrics.observe("server/publish_to_serve_seconds", now - published)
        log.info(
            "version %d served %.1f ms after its publish: found after %.1f ms, checked %.1f ms, weights %.1f ms, swap %.1f ms "
            "(held %.1f ms), recorded %.1f ms, freed %.1f ms",
            record.version, 1000 * (now - published), 1000 * (looked - published), 1000 * (checked - began), 1000 * (opened - checked),
            result.swap_ms, result.held_ms, 1000 * (switched - opened) - result.swap_ms, 1000 * (now - switched),
        )

    # -- rollback --------------------------------------------------------------------------------------
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
        refused in the store's transaction (StaleLeader) and the engine swaps back. The weights loaded
        are the checkpoint's verified private copy, as every load's."""
        async with self.lock:
            record = await asyncio.to_thread(self.store.versions.get_version, version)
            if record is None:
                raise VersionNotFound(f"no policy version {version}")
            lineage = self.lineage(segment or record.segment)
            previous = self.serving_in(lineage)
            self._check_rollback(record, lineage, previous, expect_serving)

            async def commit() -> list[int]:
                return await asyncio.to_thread(
                    self.store.versions.rollback_to, version, lineage.lane(self.learner_name), api_key_id, reason, lineage.segment,
                    expect_serving, event, term,
                )

            with contextlib.ExitStack() as stack:
                source = None
                if record.segment is not None or lineage.is_base:  # a base version into a segment: no adapter
                    try:
                        source, _, _ = await asyncio.to_thread(self.weights, record, stack, False)
                    except WeightsUnverified as exc:
                        await self.reject(record, exc)
                        raise NotServable(f"version {version}'s checkpoint is not the one its row names: {exc}") from exc
                    if source is None:
                        raise NotServable(f"version {version}'s durable checkpoint is not at {record.checkpoint_path} (not written yet, or lost)")
                result, rolled = await self.switch(lineage, version, source, "checkpoint_dir", commit, fail_row=False, counted=False)
            self.metrics.inc("server/rollbacks")
            self.metrics.observe("server/swap_hold_seconds", result.held_ms / 1000)
            log.warning("%s rolled back from version %s to %d (rolled back: %s)", lineage, previous, version, rolled)
            return RollbackResult(version, result.parent, rolled or [], result.swap_ms, result.held_ms, lineage.segment)

    def _check_rollback(self, record: VersionRecord, lineage: Lineage, previous: int | None, expect_serving: int | None) -> None:
        """Refuse, before anything swaps, a rollback that cannot be done (the module's refusals)."""
        version = record.version
        seen = previous if previous is not None else self.engine.version
        if expect_serving is not None and expect_serving != seen:
            where = "" if lineage.is_base else f" segment {lineage.segment!r}"
            raise ServingChanged(f"version {expect_serving} no longer serves{where} (now: v{seen})")
        if not lineage.is_base:
            if record.segment is not None and record.segment != lineage.segment:
                raise NotServable(f"version {version} is segment {record.segment!r}'s adapter, not {lineage.segment!r}'s")
            if record.segment is None and version != self.engine.version:
                raise NotServable(f"version {version} is not the base version serving now ({self.engine.version})")
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

    # -- the follower rule -------------------------------------------------------------------------------
    async def follow(self) -> list[SwapResult]:
        """The follower rule: swap this replica's engine to the store's serving version of each lineage
        (the base weights, each segment's adapter) where they differ, verified as every activation is,
        with no status change (the store says it serves already). A version whose weights are not
        readable yet (memory gone, durable checkpoint still being written) is tried again at the next
        pass; one whose weights fail verification is not tried again while it serves (an event records
        it). Returns the swaps made."""
        async with self.lock:
            done = []
            record = await asyncio.to_thread(self.store.versions.latest_version)
            if record is not None and record.version != self.engine.version and record.version not in self._unfollowable:
                result = await self._follow(record, BASE)
                if result is not None:
                    done.append(result)
            if self.segments:
                serving = await asyncio.to_thread(self.store.versions.serving_adapters)
                for segment in self.segments:
                    result = await self._follow_adapter(Lineage(segment), serving.get(segment))
                    if result is not None:
                        done.append(result)
            return done

    async def _follow_adapter(self, lineage: Lineage, record: VersionRecord | None) -> SwapResult | None:
        """A segment's adapter as the store says it serves (None: the base weights serve it)."""
        current = self.serving_in(lineage)
        if record is None:
            if current is None:
                return None
            result, _ = await self.switch(lineage, self.engine.version, None, "checkpoint_dir", fail_row=False, counted=False)
            log.info("%s: followed the store back to the base weights (from adapter %d)", lineage, current)
            return result
        if record.version == current or record.version in self._unfollowable or not record.checkpoint_path:
            return None
        return await self._follow(record, lineage)

    async def _follow(self, record: VersionRecord, lineage: Lineage) -> SwapResult | None:
        engine = self.engine
        if isinstance(engine, CanaryEngine) and self._candidate_in(engine, lineage) == record.version:
            previous = self.serving_in(lineage)  # another replica promoted the candidate this one holds: no load
            if lineage.is_base:
                engine.promote()
            else:
                await engine.promote_adapter(lineage.segment)
            self.metrics.inc("server/follows")
            log.info("%s: followed the store to version %d (from %s): the candidate here, promoted", lineage, record.version, previous)
            return SwapResult(record.version, previous if previous is not None else engine.version, 0.0, 0.0)
        with contextlib.ExitStack() as stack:
            try:
                source, via, handle = await asyncio.to_thread(self.weights, record, stack)
            except WeightsUnverified as exc:
                self._unfollowable.add(record.version)
                await self.reject(record, exc)
                return None
            if source is None:
                log.debug("version %d serves, but its weights are not readable here yet", record.version)
                return None
            try:
                result, _ = await self.switch(lineage, record.version, source, via)
            except SwapFailed:
                log.exception("%s: could not follow the store to version %d", lineage, record.version)
                return None
        self.metrics.inc("server/follows")
        log.info("%s: followed the store to version %d (from %d) in %.0f ms via %s", lineage, record.version, result.parent, result.swap_ms, via)
        await self.loaded(record, handle)
        return result

    @staticmethod
    def _candidate_in(engine: CanaryEngine, lineage: Lineage) -> int | None:
        return engine.candidate_version if lineage.is_base else engine.candidate_adapter_version(lineage.segment)

    async def restore_adapters(self) -> None:
        """At start: serve each segment the adapter version the store says it serves (verified; one whose
        weights fail verification is rejected, and the base weights serve that segment)."""
        async with self.lock:
            serving = await asyncio.to_thread(self.store.versions.serving_adapters)
            for segment, record in serving.items():
                if segment not in self.segments or not record.checkpoint_path:
                    continue
                with contextlib.ExitStack() as stack:
                    try:
                        source, _, _ = await asyncio.to_thread(self.weights, record, stack)
                    except WeightsUnverified as exc:
                        self._unfollowable.add(record.version)
                        await self.reject(record, exc)
                        continue
                    if source is not None:
                        await self.switch(Lineage(segment), record.version, source, "checkpoint_dir", fail_row=False, counted=False)

    async def resume_from_memory(self, version: int, handle: WeightHandle) -> None:
        """At start (server/control/startup.py `finish_start`): the engine started from the nearest
        ancestor on disk; swap it to `version`'s weights from the transport's memory (verified against
        the row: nonce and digest). The store says `version` serves already: nothing to record."""
        assert self.receiver is not None
        async with self.lock:
            with self.receiver.open(handle) as source:
                await self.switch(BASE, version, source, self.receiver.backend, fail_row=False)

    # -- the watcher -----------------------------------------------------------------------------------
    async def _watch_adapters(self) -> None:
        """One pass of `watch` over the segments: each unpaused one gets its newest published adapter."""
        for segment in self.segments:
            if segment in self.gate_segments or await asyncio.to_thread(self.store.operator.learning_paused, self.lane(segment)):
                continue
            current = self.engine.adapter_version(segment)
            published = await asyncio.to_thread(self.store.versions.versions_with_status, VersionStatus.PUBLISHED, current or -1, segment)
            if published:
                done = await self.activate(published[-1])
                if done:
                    log.info("segment %s: activated adapter version %d in %.0f ms", segment, done.version, done.swap_ms)

    async def watch(self, poll_seconds: float) -> None:
        """Each pass: follow the store's serving versions (`follow`: what another replica activated or
        rolled back), then activate what learners publish: the newest PUBLISHED version past the
        serving one (its activation supersedes the older published ones), unless learning is paused.
        Passes run every `poll_seconds`, and at once when a co-located learner rings the transport's
        bell (liveloop/transport/bell.py: a version's memory is finished). Its row is written just
        after its memory, so until a pass sees the rung version's row the watcher looks again after
        RING_RETRY_SECONDS, doubling, for up to RING_PATIENCE_SECONDS. Runs until cancelled."""
        bell = self.receiver.bell() if self.receiver is not None else None
        expected, retry, until = -1, RING_RETRY_SECONDS, 0.0  # the newest version rung whose row no pass has seen yet
        try:
            while True:
                try:
                    self.looked_at = time.time()
                    await self.follow()
                    if self.segments:
                        await self._watch_adapters()
                    if self.gate_base or await asyncio.to_thread(self.store.operator.learning_paused, self.learner_name):
                        expected = -1  # nothing this watcher activates: no hurry
                    else:
                        published = await asyncio.to_thread(self.store.versions.versions_with_status, VersionStatus.PUBLISHED, self.engine.version)
                        if published and published[-1].version >= expected:
                            expected = -1
                        if published:
                            done = await self.activate(published[-1])
                            if done:
                                log.info("activated version %d in %.0f ms (from %s)", done.version, done.swap_ms, self.last_swap_via)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("version watcher")
                if bell is None:
                    await asyncio.sleep(poll_seconds)
                    continue
                hurry = expected > self.engine.version and time.monotonic() < until
                rung = await bell.wait(retry if hurry else poll_seconds)
                retry = min(2 * retry, poll_seconds) if hurry else RING_RETRY_SECONDS
                if rung and max(rung) > max(expected, self.engine.version):
                    expected, retry, until = max(rung), RING_RETRY_SECONDS, time.monotonic() + RING_PATIENCE_SECONDS
        finally:
            if bell is not None:
                bell.close()
