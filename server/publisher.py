"""Publishing a policy version into the live engine, with its row in the store.

Order matters for integrity: the `policy_versions` row is written first (status "loading"), so a
response that records the new version always has its row; then the engine swaps atomically; then the
row becomes "serving" and its parent "retired". A failed swap leaves the old version serving and the
row marked "failed". Learners write their own rows (status "published"); `watch` activates them,
unless the operator paused learning. `rollback` swaps a stored version back in, then records it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from liveloop.checkpoint import checkpoint_digest

from liveloop.metrics import Metrics
from liveloop.server.engines.base import Engine
from liveloop.server.errors import APIError
from liveloop.store import RollbackRefused, Store, VersionRecord

log = logging.getLogger(__name__)


class SwapFailed(RuntimeError):
    """The engine could not load a version's weights."""


class Publisher:
    def __init__(self, engine: Engine, store: Store, metrics: Metrics, learner_name: str = "sao"):
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.learner_name = learner_name  # whose pause also holds back activation
        self._lock = asyncio.Lock()

    async def publish_dir(self, path: str, note: str | None = None, **row: object) -> dict:
        directory = Path(path)
        try:
            usable = directory.is_dir() and any(directory.glob("*.safetensors"))
        except OSError:  # a name too long, a permission: not a directory we can load
            usable = False
        if not usable:
            raise APIError(400, f"path: {path} is not a checkpoint directory with *.safetensors", param="path")
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
                status="loading",
                note=note,
                **row,
            )
            try:
                return await self._swap(version, str(directory))
            except SwapFailed as exc:
                raise APIError(400, f"could not load {path}: {exc.__cause__}", param="path") from exc

    async def activate(self, record: VersionRecord) -> dict | None:
        """Swap in a version a learner published (row already written); None if it failed to load."""
        async with self._lock:
            if record.version <= self.engine.version:
                return None
            try:
                return await self._swap(record.version, record.checkpoint_path)
            except SwapFailed:
                log.exception("could not activate version %d", record.version)
                return None

    async def rollback(self, version: int, api_key_id: str | None = None, reason: str | None = None) -> dict:
        """Serve stored `version` again: the engine swaps atomically (drained, like any swap), then one
        store transaction marks the later versions rolled back and points the learner at `version`.
        If that transaction fails, the engine swaps back: the store and the engine never disagree."""
        async with self._lock:
            record = await asyncio.to_thread(self.store.get_version, version)
            if record is None:
                raise APIError(404, f"no policy version {version}", param="version")
            if record.status in ("failed", "loading") or not record.checkpoint_path:
                raise APIError(409, f"version {version} cannot be served (status {record.status})", param="version")
            if record.pruned_at is not None:
                raise APIError(
                    409, f"version {version}'s checkpoint was pruned at {record.pruned_at.isoformat()}: it cannot serve again "
                    "(pin versions you may roll back to)", param="version",
                )
            previous = self.engine.version
            if version == previous:
                raise APIError(409, f"version {version} is already serving", param="version")
            old = await asyncio.to_thread(self.store.get_version, previous)
            start = time.perf_counter()
            try:
                held = await self.engine.update_weights(record.checkpoint_path, version)
            except Exception as exc:
                self.metrics.inc("server/swap_failures")
                raise APIError(409, f"could not load version {version}: {exc}", param="version") from exc
            try:
                rolled = await asyncio.to_thread(self.store.rollback_to, version, self.learner_name, api_key_id, reason)
            except Exception as exc:
                log.exception("rollback to %d not recorded: swapping version %d back in", version, previous)
                await self.engine.update_weights(old.checkpoint_path, previous)
                if isinstance(exc, RollbackRefused):
                    raise APIError(409, str(exc), param="version") from exc
                raise
            swap_s = time.perf_counter() - start
            self.metrics.inc("server/rollbacks")
            self.metrics.observe("server/swap_hold_seconds", held)
            log.warning("rolled back from version %d to %d (rolled back: %s)", previous, version, rolled)
            return {"version": version, "previous": previous, "rolled_back": rolled, "swap_ms": swap_s * 1000, "held_ms": held * 1000}

    async def _swap(self, version: int, path: str) -> dict:
        """Swap `path` in as `version` (its row exists); a load failure marks the row "failed" and
        raises SwapFailed (the old version keeps serving)."""
        parent = self.engine.version
        start = time.perf_counter()
        preempted = getattr(self.engine, "swap_preempted", 0)
        try:
            held = await self.engine.update_weights(path, version)
        except Exception as exc:
            await asyncio.to_thread(self.store.set_version_status, version, "failed")
            self.metrics.inc("server/swap_failures")
            raise SwapFailed(version) from exc
        finally:
            self.metrics.inc("server/swap_preempted", getattr(self.engine, "swap_preempted", 0) - preempted)
        await asyncio.to_thread(self.store.set_version_status, version, "serving")
        await asyncio.to_thread(self.store.set_version_status, parent, "retired")
        swap_s = time.perf_counter() - start
        self.metrics.observe("server/swap_seconds", swap_s)
        self.metrics.observe("server/swap_hold_seconds", held)
        self.metrics.inc("server/swaps")
        return {"version": version, "parent": parent, "swap_ms": swap_s * 1000, "held_ms": held * 1000}

    async def watch(self, poll_seconds: float) -> None:
        """Activate what learners publish: the newest "published" version past the serving one
        (older published ones are superseded). Runs until cancelled."""
        while True:
            try:
                if await asyncio.to_thread(self.store.learning_paused, self.learner_name):
                    await asyncio.sleep(poll_seconds)
                    continue
                published = await asyncio.to_thread(self.store.versions_with_status, "published", self.engine.version)
                if published:
                    for older in published[:-1]:
                        await asyncio.to_thread(self.store.set_version_status, older.version, "superseded")
                    done = await self.activate(published[-1])
                    if done:
                        log.info("activated version %d in %.0f ms", done["version"], done["swap_ms"])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("version watcher")
            await asyncio.sleep(poll_seconds)
