"""The version control plane under a long random interleaving, on a real hf engine and real SQLite and
PostgreSQL: learner publishes (on whatever lineage the learner last read), activations (of the newest
published version, or of a record read long ago, as a slow watcher would), rollbacks to the serving
version's parent and operator swaps, up to three in flight at once, 1,000 operations (200 on
PostgreSQL), while traffic generates throughout. Whatever the order:

- a rolled-back version never serves again: no generation that starts after its rollback returned
  runs on it (unless an operator's rollback named it since: two operators rolling back at once, the
  later one wins);
- every version a generation ran on is one the store made serving (its final status is serving,
  retired or rolled back: never published, superseded, failed or loading);
- numbers never collide: the only errors are the domain refusals of a lost race;
- when it settles, the engine serves the store's one serving version;
- an operator's version table, read throughout (`Operations.versions`, what /admin/versions shows),
  never contradicts itself: the version the engine serves is the one the store's rows say serves.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from pathlib import Path

import pytest

from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.control.operations import Operations
from liveloop.server.control.activator import AlreadyServing, NotServable, Activator
from liveloop.server.control.weights_import import WeightImports
from liveloop.store import RollbackRefused, StaleLineage, Store, TransitionRefused, VersionStatus

S = VersionStatus
REFUSALS = (StaleLineage, RollbackRefused, TransitionRefused, NotServable, AlreadyServing)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("soak")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (11, 12, 13)]


class Soak:
    """The operations, what they did, and what traffic saw."""

    def __init__(self, activator: Activator, store: Store, checkpoints: list[Path], imports: WeightImports, seed: int):
        self.activator, self.store, self.checkpoints, self.imports = activator, store, checkpoints, imports
        self.rng = random.Random(seed)
        self.read: list = []  # every version record an activation read (a slow watcher's stale reads)
        # version -> (called, returned, may serve) of each rollback that took it off or named it
        self.history: dict[int, list[tuple[float, float, bool]]] = {}
        self.served: list[tuple[float, int]] = []  # (start, version) of every generation
        self.done: dict[str, int] = {}  # operation -> how many the store and the activator carried out
        self.refused: dict[str, int] = {}
        self.tables: list[tuple[list[int], list[int]]] = []  # (engine's serving, store's SERVING) per table read

    def _count(self, table: dict[str, int], op: str) -> None:
        table[op] = table.get(op, 0) + 1

    async def learn(self) -> None:
        cursor = self.store.versions.cursor_version("sao")
        parent = cursor if cursor is not None else self.store.versions.latest_version().version
        self.store.versions.publish_version(
            parent=parent, checkpoint_path=str(self.rng.choice(self.checkpoints)), checkpoint_sha256=None,
            learner_step=1, samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=0,
        )

    async def activate(self) -> bool:
        published = self.store.versions.versions_with_status(S.PUBLISHED, -1)
        self.read.extend(published)
        if self.read and (not published or self.rng.random() < 0.3):
            record = self.rng.choice(self.read)  # read long ago
        elif published:
            record = published[-1]
        else:
            return False
        return await self.activator.activate(record) is not None

    async def rollback(self) -> bool:
        serving = self.store.versions.latest_version()
        if serving.parent is None:
            return False
        called = time.monotonic()
        result = await self.activator.rollback(serving.parent, reason="soak")
        now = time.monotonic()
        for v in result.rolled_back:
            self.history.setdefault(v, []).append((called, now, False))
        self.history.setdefault(result.version, []).append((called, now, True))
        return True

    def may_serve(self, version: int, at: float) -> bool:
        """Whether `version` may serve a generation that started at `at`: no rollback that took it off
        had returned by then, or one that names it had been called by then and returned after the last
        that took it off (rollbacks take the activator's lock in turn: they act in the order they
        return; the engine swaps a rollback's version in between its call and its return)."""
        events = self.history.get(version, [])
        offs = [returned for _, returned, may in events if not may and returned <= at]
        if not offs:
            return True
        return any(may and called <= at and returned > max(offs) for called, returned, may in events)

    async def operator(self) -> bool:
        staged = await asyncio.to_thread(self.imports.stage, str(self.rng.choice(self.checkpoints)))  # POST /admin/weights' copy
        await self.activator.activate_import(staged, note="soak")
        return True

    async def run_one(self, op: str) -> None:
        try:
            carried = await getattr(self, op)()
        except REFUSALS:
            self._count(self.refused, op)
            return
        if carried is not False:
            self._count(self.done, op)

    async def traffic(self, stop: asyncio.Event) -> None:
        engine = self.activator.engine
        while not stop.is_set():
            start = time.monotonic()
            request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=2, seed=1))
            async with engine.generate(request) as gen:
                async for _ in gen:
                    pass
            self.served.append((start, gen.version))
            await asyncio.sleep(0)

    async def views(self, stop: asyncio.Event, operations: Operations) -> None:
        """An operator reading the version table throughout: the engine's serving version and the
        store's SERVING row, both in every table, must be the same one."""
        while not stop.is_set():
            rows = [r for r in await operations.versions() if r.segment is None]
            engine_says = [r.version for r in rows if r.serving]
            store_says = [r.version for r in rows if r.status == S.SERVING]
            self.tables.append((engine_says, store_says))
            await asyncio.sleep(0)


async def test_rollbacks_swaps_and_publishes_interleaved(engine, store, checkpoints, store_url, model_dir, tmp_path):
    total = int(os.environ.get("LIVELOOP_SOAK_OPS", "1000" if store_url.startswith("sqlite") else "200"))
    imports = WeightImports(tmp_path / "versions", model_dir, 1 << 30)
    soak = Soak(Activator(engine, store.versions, store.operator, Metrics()), store, checkpoints, imports, seed=0)
    ops = soak.rng.choices(["learn", "activate", "rollback", "operator"], weights=[4, 4, 2, 1], k=total)
    stop = asyncio.Event()
    traffic = asyncio.create_task(soak.traffic(stop))
    operations = Operations(
        MonitorConfig(), soak.activator, Metrics(),
        feedback=store.feedback, versions=store.versions, operator=store.operator, release=store.release, keys=store.keys,
    )
    views = asyncio.create_task(soak.views(stop, operations))
    in_flight: set[asyncio.Task] = set()
    try:
        for op in ops:
            while len(in_flight) >= 3:
                finished, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()  # anything but a domain refusal fails the test here
            in_flight.add(asyncio.create_task(soak.run_one(op)))
            await asyncio.sleep(0)
        for task in asyncio.as_completed(in_flight):
            await task
        await asyncio.sleep(0.05)
    finally:
        for task in in_flight:
            task.cancel()
        stop.set()
        await traffic
        await views

    # the interleaving did what it says: each kind of operation was carried out many times
    for op, least in {"learn": total // 10, "activate": total // 40, "rollback": total // 50, "operator": total // 50}.items():
        assert soak.done.get(op, 0) >= least, (op, soak.done, soak.refused)

    statuses = {v.version: v.status for v in store.versions.list_versions()}
    # a rolled-back version never serves again
    for start, version in soak.served:
        assert soak.may_serve(version, start), (version, start, soak.history[version])
        assert statuses[version] in (S.SERVING, S.RETIRED, S.ROLLED_BACK), (version, statuses[version])
    last = {v: max(events, key=lambda e: e[1])[2] for v, events in soak.history.items()}
    assert all(statuses[v] == S.ROLLED_BACK for v, may in last.items() if not may)
    # settled: one serving version, and the engine serves it
    serving = [v for v, s in statuses.items() if s == S.SERVING]
    assert serving == [store.versions.latest_version().version] == [engine.version]
    assert len(soak.served) > total // 10
    # every version table read during it agreed with itself
    torn = [t for t in soak.tables if t[0] != t[1] or len(t[0]) != 1]
    assert not torn and len(soak.tables) > total // 10, (len(torn), len(soak.tables), torn[:5])
