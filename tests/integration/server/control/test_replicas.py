"""Several replicas over one store, without Ray: two real applications in this process (`build_app`:
the hf engine on the tiny model, the writer, the version watcher and the heartbeat), each a replica
of the fleet under its own `[server] replica_id`, on SQLite and PostgreSQL.

- the replica registry: each registers and heartbeats itself; `GET /admin/replicas`, `GET
  /v1/versions` (`replicas`) and `/metrics` show the same fleet whichever replica answers; every
  response names its replica; a replica that stops leaves the fleet, one whose heartbeat is old is down;
- the follower rule (server/control/activator.py `follow`): an operator's import activated through one
  replica, a rollback through the other and a pause reach both; two replicas activating the same
  published version both keep it (no dropped activation, no swap back); a replica never moves back
  unless the store rolled back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, USER_KEY, free_port, perturbed_checkpoint, wait_until, write_config
from liveloop.metrics import Metrics
from liveloop.segments import Lineage
from liveloop.server.config import EngineConfig
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.control.activator import Activator
from liveloop.store import Store, StoreConfig, VersionStatus
from liveloop.store.replicas import Beat, serving_by_version

S = VersionStatus
FLEET = """
[monitor]
enabled = false
"""
CHAT = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about cats."}], "max_tokens": 4}


pytestmark = pytest.mark.usefixtures("one_checkpoint_read_at_a_time")  # two engines in one process (conftest)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("replica-checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2)]


@pytest.fixture
def fleet(store_url, tmp_path, model_dir):
    """Two replicas (r1, r2) of one deployment on one store, each a TestClient with the admin key."""
    port = free_port()
    path, _ = write_config(tmp_path, Path(model_dir).resolve(), "hf", port, store_url=store_url, extra=FLEET, server_extra="watch_seconds = 0.05\nheartbeat_seconds = 0.5\ndown_after_seconds = 2.0")
    config = load_config(path)
    with contextlib.ExitStack() as stack:
        clients = {}
        for name in ("r1", "r2"):
            app = build_app(config.with_section("server", replica_id=name), Path(model_dir))
            client = stack.enter_context(TestClient(app, base_url=f"http://127.0.0.1:{port}", raise_server_exceptions=False))
            client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
            clients[name] = client
        yield clients


def _serving(client: TestClient) -> dict[str, int | None]:
    return {r["id"]: r["serving_version"] for r in client.get("/admin/replicas").json()["data"] if r["state"] == "up"}


def _chat_version(client: TestClient) -> tuple[str, int]:
    r = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {USER_KEY}"})
    assert r.status_code == 200, r.text
    return r.headers["x-liveloop-replica"], r.json()["policy_version"]


def _all_serve(fleet: dict[str, TestClient], version: int, timeout: float = 10.0) -> None:
    wait_until(lambda: _serving(fleet["r1"]) == {"r1": version, "r2": version}, timeout, f"both replicas serving v{version}")
    for name, client in fleet.items():  # and what each one's traffic records
        assert _chat_version(client) == (name, version)


def test_the_fleet_is_one_view_from_every_replica(fleet):
    wait_until(lambda: len(_serving(fleet["r2"])) == 2, 10, "both replicas registered")
    views = [c.get("/admin/replicas").json() for c in fleet.values()]
    assert [v["replica"] for v in views] == ["r1", "r2"]  # the one that answered
    for view in views:
        rows = {r["id"]: r for r in view["data"]}
        assert set(rows) == {"r1", "r2"}
        for row in rows.values():
            assert (row["kind"], row["state"], row["serving_version"], row["healthy"], row["in_flight"]) == ("process", "up", 0, True, 0)
            assert row["pid"] > 0  # "up" is the heartbeat's verdict (younger than down_after); its age is the machine's
    for name, client in fleet.items():
        assert _chat_version(client) == (name, 0)
        versions = client.get("/v1/versions", headers={"Authorization": f"Bearer {USER_KEY}"}).json()["data"]
        assert versions[0]["version"] == 0 and sorted(versions[0]["replicas"]) == ["r1", "r2"]
        metrics = client.get("/metrics").text
        assert 'liveloop_fleet_replica_version{replica="r1"} 0.0' in metrics
        assert 'liveloop_fleet_replica_up{replica="r2"} 1.0' in metrics and "liveloop_fleet_replicas_up 2.0" in metrics
    # users never see the fleet
    assert fleet["r1"].get("/admin/replicas", headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 403


def test_an_import_a_rollback_and_a_pause_reach_every_replica(fleet, checkpoints, store_url):
    r1, r2 = fleet["r1"], fleet["r2"]
    # an operator's import through r1: r2 follows the store
    swapped = r1.post("/admin/weights", json={"path": str(checkpoints[0])})
    assert swapped.status_code == 200, swapped.text
    v1 = swapped.json()["version"]
    _all_serve(fleet, v1)
    # a rollback through r2: r1 follows it back (the store rolled back)
    rolled = r2.post("/admin/rollback", json={"version": 0, "expect_serving": v1})
    assert rolled.status_code == 200, rolled.text
    _all_serve(fleet, 0)
    # a pause through r1 holds back both replicas' activations of what a learner publishes
    assert r1.post("/admin/learning/pause", json={"reason": "test"}).status_code == 200
    store = Store(StoreConfig(url=store_url))
    try:
        v2 = store.versions.publish_version(
            parent=0, checkpoint_path=str(checkpoints[1]), checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
            cursor_name="sao", last_feedback_id=0,
        ).version
        time.sleep(1.0)  # 20 watch intervals
        assert _serving(r1) == {"r1": 0, "r2": 0} and store.versions.get_version(v2).status == S.PUBLISHED
        assert r2.post("/admin/learning/resume").status_code == 200
        _all_serve(fleet, v2)
        assert store.versions.get_version(v2).status == S.SERVING
        kinds = [e.kind for e in store.operator.events()]
        assert "activation_dropped" not in kinds and "weights_rejected" not in kinds
    finally:
        store.close()


def test_a_stopped_replica_leaves_and_a_silent_one_is_down(store):
    registry = store.fleet.registry
    registry.register("a", "process", "h", 1, Beat(3, {"cozy": 5}, 2, True))
    registry.register("b", "ray_serve", "h", 2, Beat(3, {"cozy": None}, 0, False))
    rows = {r.replica_id: r for r in registry.rows(down_after=5.0)}
    assert (rows["a"].state, rows["b"].state) == ("up", "unhealthy")
    assert (rows["a"].adapter_versions, rows["a"].in_flight) == ({"cozy": 5}, 2)
    assert serving_by_version(list(rows.values())) == {3: ["a", "b"], 5: ["a"]}
    time.sleep(0.3)
    assert registry.beat("a", Beat(4, {}, 0, True))
    rows = {r.replica_id: r for r in registry.rows(down_after=0.2)}
    assert (rows["a"].state, rows["b"].state, rows["a"].serving_version) == ("up", "down", 4)
    assert serving_by_version(list(rows.values())) == {4: ["a"]}  # a down replica serves nothing
    registry.remove("a")
    assert [r.replica_id for r in registry.rows(down_after=5.0)] == ["b"]
    assert not registry.beat("a", Beat(4, {}, 0, True))  # gone: its heartbeat registers it again
    registry.register("c", "process", "h", 3, Beat(0, {}, 0, True), forget_after=0.1)  # forgets b, silent for 0.3 s
    assert [r.replica_id for r in registry.rows(down_after=5.0)] == ["c"]


def _learner_publish(store: Store, parent: int, checkpoint: Path) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


async def test_the_follower_rule(store, engine, model_dir, checkpoints):
    other = HFEngine(EngineConfig(backend="hf", model=str(model_dir), drain_deadline_seconds=5.0), model_dir)
    await other.start(version=0)
    try:
        a, b = Activator(engine, store.versions, store.operator, Metrics()), Activator(other, store.versions, store.operator, Metrics())
        # both replicas activate the same published version at once: both serve it, nothing dropped or undone
        v1 = _learner_publish(store, 0, checkpoints[0])
        record = store.versions.get_version(v1)
        results = await asyncio.gather(a.activate(record), b.activate(record))
        assert sum(r is not None for r in results) >= 1
        await asyncio.gather(a.follow(), b.follow())
        assert (engine.version, other.version) == (v1, v1) and store.versions.get_version(v1).status == S.SERVING
        assert [e.kind for e in store.operator.events()] == []
        # one activates the next; the other follows at its next pass, with no status change
        v2 = _learner_publish(store, v1, checkpoints[1])
        assert (await a.activate(store.versions.get_version(v2))).version == v2
        followed = await b.follow()
        assert [r.version for r in followed] == [v2] and other.version == v2
        assert await b.follow() == []  # nothing to do: it serves what the store says
        # a replica never moves back on its own: an older version only by the store's rollback
        assert await b.activate(store.versions.get_version(v1)) is None and other.version == v2
        store.versions.rollback_to(v1, "sao")
        assert [r.version for r in await b.follow()] == [v1] and [r.version for r in await a.follow()] == [v1]
        assert (engine.version, other.version) == (v1, v1)
    finally:
        await other.close()


async def test_the_follower_rule_for_a_segments_adapter(store, model_dir, tmp_path):
    from liveloop.devtools import random_lora_adapter

    def adapter_engine() -> HFEngine:
        return HFEngine(EngineConfig(backend="hf", model=str(model_dir), max_adapters=4, max_lora_rank=4), model_dir)

    engines = [adapter_engine(), adapter_engine()]
    for e in engines:
        await e.start(version=0)
    try:
        a, b = (Activator(e, store.versions, store.operator, Metrics(), segments=("cozy",)) for e in engines)
        adapter = random_lora_adapter(model_dir, tmp_path / "cozy1", seed=1, rank=4)
        v1 = store.versions.publish_version(
            parent=0, checkpoint_path=str(adapter), checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
            cursor_name="sao:cozy", last_feedback_id=0, segment="cozy",
        ).version
        assert (await a.activate(store.versions.get_version(v1))).version == v1
        assert [r.version for r in await b.follow()] == [v1]
        assert engines[1].adapter_version("cozy") == v1 and engines[1].version == 0  # the base weights untouched
        # the segment served by the base again (a rollback through `a`): `b` unloads its adapter
        await a.rollback(0, lineage=Lineage("cozy"))
        await b.follow()
        assert (engines[0].adapter_version("cozy"), engines[1].adapter_version("cozy")) == (None, None)
        assert await b.follow() == []
    finally:
        for e in engines:
            await e.close()


def test_the_heartbeat_writes_at_once_what_a_replica_serves_and_its_load_only_with_the_periodic_beat(store):
    """A change of what the replica serves (or of its health) is written at the next look; the
    generations running, which change at every look under load, wait for the periodic beat (a write
    transaction at every look cost the serving process under load: server/control/fleet.py)."""
    from liveloop.server.control.fleet import heartbeat

    registry = store.fleet.registry
    now, looks = {"beat": Beat(0, {}, 0, True)}, []

    def beat() -> Beat:
        looks.append(now["beat"])
        return now["beat"]

    def row():
        return next((r for r in registry.rows(down_after=60.0) if r.replica_id == "hb"), None)

    async def until(predicate) -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        task = asyncio.create_task(heartbeat(registry, "hb", "process", beat, 0.005, 3600.0))
        try:
            await asyncio.wait_for(until(lambda: row() is not None), 30)
            for n in range(1, 10):  # the load moves at every look: no rewrite
                now["beat"] = Beat(0, {}, n, True)
                seen = len(looks)
                await asyncio.wait_for(until(lambda: len(looks) >= seen + 2), 30)
            assert (row().serving_version, row().in_flight) == (0, 0)
            now["beat"] = Beat(1, {}, 7, True)  # what it serves changed: written at the next look, load and all
            await asyncio.wait_for(until(lambda: row().serving_version == 1), 30)
            assert row().in_flight == 7
            now["beat"] = Beat(1, {}, 7, False)  # so is its health
            await asyncio.wait_for(until(lambda: not row().healthy), 30)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
