"""Publishing a policy version into the live engine, with its row in the store.

Order matters for integrity: the `policy_versions` row is written first (status LOADING), so a
response that records the new version always has its row; then the engine swaps atomically; then the
row becomes SERVING and its parent RETIRED. A failed swap leaves the old version serving and the
row marked FAILED. Learners write their own rows (status PUBLISHED); `watch` activates them,
unless the operator paused learning. `rollback` swaps a stored version back in, then records it.

Results are typed (`SwapResult`, `RollbackResult`); refusals are domain exceptions (`CheckpointUnusable`,
`VersionNotFound`, `NotServable`, `AlreadyServing`, `SwapFailed`, the store's `RollbackRefused`) that
the HTTP edge maps to statuses (server/errors.py) and the background guard logs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from liveloop.checkpoint import checkpoint_digest

from liveloop.metrics import Metrics
from liveloop.server.engines.base import Engine
from liveloop.store import Store, VersionNotFound, VersionRecord, VersionStatus

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
    """A stored version served again: the one it replaced and the versions marked rolled back."""

    version: int
    previous: int
    rolled_back: list[int]
    swap_ms: float
    held_ms: float


class Publisher:
    def __init__(self, engine: Engine, store: Store, metrics: Metrics, learner_name: str = "sao"):
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.learner_name = learner_name  # whose pause also holds back activation
        self._lock = asyncio.Lock()

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
        """Swap in a version a learner published (row already written); None if it failed to load."""
        async with self._lock:
            if record.version <= self.engine.version:
                return None
            try:
                return await self._swap(record.version, record.checkpoint_path)
            except SwapFailed:
                log.exception("could not activate version %d", record.version)
                return None

    async def rollback(self, version: int, api_key_id: str | None = None, reason: str | None = None) -> RollbackResult:
        """Serve stored `version` again: the engine swaps atomically (drained, like any swap), then one
        store transaction marks the later versions rolled back and points the learner at `version`.
        If that transaction fails, the engine swaps back: the store and the engine never disagree.
        Raises VersionNotFound, NotServable, AlreadyServing, SwapFailed or the store's RollbackRefused."""
        async with self._lock:
            record = await asyncio.to_thread(self.store.get_version, version)
            if record is None:
                raise VersionNotFound(f"no policy version {version}")
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

    async def _swap(self, version: int, path: str) -> SwapResult:
        """Swap `path` in as `version` (its row exists); a load failure marks the row FAILED and
        raises SwapFailed (the old version keeps serving)."""
        parent = self.engine.version
        start = time.perf_counter()
        preempted = self.engine.swap_preempted
        try:
            held = await self.engine.update_weights(path, version)
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
        self.metrics.observe("server/swap_hold_seconds", held)
        self.metrics.inc("server/swaps")
        return SwapResult(version, parent, swap_s * 1000, held * 1000)

    async def watch(self, poll_seconds: float) -> None:
        """Activate what learners publish: the newest PUBLISHED version past the serving one
        (older published ones are SUPERSEDED). Runs until cancelled."""
        while True:
            try:
                if await asyncio.to_thread(self.store.learning_paused, self.learner_name):
                    await asyncio.sleep(poll_seconds)
                    continue
                published = await asyncio.to_thread(self.store.versions_with_status, VersionStatus.PUBLISHED, self.engine.version)
                if published:
                    for older in published[:-1]:
                        await asyncio.to_thread(self.store.set_version_status, older.version, VersionStatus.SUPERSEDED)
                    done = await self.activate(published[-1])
                    if done:
                        log.info("activated version %d in %.0f ms", done.version, done.swap_ms)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("version watcher")
            await asyncio.sleep(poll_seconds)
