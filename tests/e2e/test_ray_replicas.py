"""The endpoint as a Ray Serve application, end to end: `liveloop serve --config ray` (a config that
extends the preset) in its own process: a private local Ray, 2 replicas each with its own hf engine,
ONE learner actor, PostgreSQL as the store.

- concurrent users through the official `openai` client and httpx reach both replicas, chat and rate;
  the learner publishes versions once and every replica activates or follows each: every response
  records the version it names, no replica's served version goes backwards (its registry row, read
  every 0.1 s), every version a replica served was one the store made serving, and all replicas
  converge to the newest within a bound;
- a replica killed with `kill -9` (its pid from /admin/replicas) is restarted by Serve and serves the
  newest version, published while it was gone; the dead one shows "down";
- a rollback through the endpoint reaches both replicas (their traffic records it); a pause holds
  back both replicas' activations of a published version, and resuming lets both serve it.

PostgreSQL required (skipped without LIVELOOP_TEST_PG_URL, like the `store_url` fixture)."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from liveloop.devtools import ADMIN_KEY, USER_KEYS, perturbed_checkpoint, wait_until
from liveloop.store import Store, StoreConfig, VersionStatus
from ..conftest import fresh_pg_database
from .conftest import start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

S = VersionStatus
FLEET = """
[ray]
replicas = 2
[monitor]
enabled = false
"""
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PROMPTS = ["Tell me about cats.", "What do owls eat?", "Describe the sea.", "Say something kind."]


@pytest.fixture(scope="module")
def pg_url():
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, model_dir, pg_url):
    server = start_server(
        tmp_path_factory.mktemp("ray-fleet"), model_dir, "hf", learner="", extra=FLEET, extends=["ray", "tiny"], store_url=pg_url, timeout=420,
    )
    try:
        wait_until(lambda: httpx.get(server.base_url + "/admin/learner", headers=ADMIN, timeout=10).json().get("running"), 180, "the learner")
        yield server
    finally:
        stop_server(server)


def _replicas(server) -> list[dict]:
    return httpx.get(server.base_url + "/admin/replicas", headers=ADMIN, timeout=10).json()["data"]


def _up(server) -> dict[str, int]:
    return {r["id"]: r["serving_version"] for r in _replicas(server) if r["state"] == "up"}


def _serving(store: Store) -> int:
    return store.versions.latest_version().version


def _converged(server, store: Store, n: int = 2) -> int | None:
    """The store's serving version once `n` replicas are up and all serve it."""
    up, serving = _up(server), _serving(store)
    return serving if len(up) == n and set(up.values()) == {serving} else None


def _chats(server, n: int) -> list[tuple[str, int]]:
    """`n` chats, unrated: (replica, policy_version) of each."""
    seen = []
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEYS[5]}"}, timeout=60) as client:
        for i in range(n):
            r = client.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": [{"role": "user", "content": PROMPTS[i % 4]}], "max_tokens": 4})
            assert r.status_code == 200, r.text
            seen.append((r.headers["x-liveloop-replica"], r.json()["policy_version"]))
    return seen


class Users:
    """Simulated users: each chats and rates every reply; half through the `openai` client, half
    through httpx. Records (replica, policy_version, response id) of every reply."""

    def __init__(self, server):
        self.server, self.seen, self._lock = server, [], threading.Lock()

    def _openai(self, key: str, rounds: int) -> None:
        from openai import OpenAI

        client = OpenAI(base_url=self.server.base_url + "/v1", api_key=key, max_retries=0, timeout=60)
        for i in range(rounds):
            raw = client.chat.completions.with_raw_response.create(
                model="liveloop-tiny", messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], max_tokens=8,
            )
            reply = raw.parse()
            self._record(raw.headers["x-liveloop-replica"], reply.model_extra["policy_version"], reply.id)
            client.post("/feedback", cast_to=object, body={"response_id": reply.id, "reward": "up" if i % 2 else "down"})

    def _httpx(self, key: str, rounds: int) -> None:
        with httpx.Client(base_url=self.server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
            for i in range(rounds):
                r = client.post("/v1/chat/completions", json={
                    "model": "liveloop-tiny", "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "max_tokens": 8,
                })
                assert r.status_code == 200, r.text
                body = r.json()
                self._record(r.headers["x-liveloop-replica"], body["policy_version"], body["id"])
                assert client.post("/v1/feedback", json={"response_id": body["id"], "reward": "up"}).status_code == 200

    def _record(self, replica: str, version: int, response_id: str) -> None:
        with self._lock:
            self.seen.append((replica, version, response_id))

    def run(self, users: int, rounds: int) -> None:
        with ThreadPoolExecutor(users) as pool:
            futures = [pool.submit(self._openai if u % 2 else self._httpx, USER_KEYS[u], rounds) for u in range(users)]
            for f in futures:
                f.result()


class Watcher:
    """Reads the registry every 0.1 s: each replica's served versions in order."""

    def __init__(self, server):
        self.server, self.history, self._stop = server, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for r in _replicas(self.server):
                if r["state"] == "up":
                    seq = self.history.setdefault(r["id"], [])
                    if not seq or seq[-1] != r["serving_version"]:
                        seq.append(r["serving_version"])
            self._stop.wait(0.1)

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def test_every_replica_follows_every_push(fleet):
    store = Store(StoreConfig(url=fleet.store_url))
    try:
        first = _serving(store)
        users = Users(fleet)
        with Watcher(fleet) as watcher:
            users.run(users=4, rounds=8)
            latest = wait_until(lambda: _converged(fleet, store), 15, "both replicas on the newest version")
        assert latest > first, "the learner published no version from 32 ratings"
        replicas = {replica for replica, _, _ in users.seen}
        assert len(replicas) == 2, f"one replica took all the traffic: {replicas}"
        # every response records the version it named; every version served was made serving by the store
        statuses = {v.version: v.status for v in store.versions.list_versions()}
        for replica, version, response_id in users.seen:
            assert store.feedback.get_response(response_id).policy_version == version
            assert statuses[version] in (S.SERVING, S.RETIRED), (version, statuses[version])
        # no replica went backwards (no rollback in this phase), and each saw several pushes
        for replica, versions in watcher.history.items():
            assert versions == sorted(versions), (replica, versions)
        assert all(len(v) >= 2 for v in watcher.history.values()), watcher.history
        assert "activation_dropped" not in {e.kind for e in store.operator.events()}
    finally:
        store.close()


def test_a_killed_replica_comes_back_on_the_latest_version(fleet):
    store = Store(StoreConfig(url=fleet.store_url))
    try:
        before = wait_until(lambda: _converged(fleet, store), 15, "a converged fleet")
        victim = next(r for r in _replicas(fleet) if r["state"] == "up")
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(5.0)  # Serve's controller marks it dead and stops routing to it (a request in flight there fails)
        Users(fleet).run(users=2, rounds=5)  # pushes while it is gone (Serve routes to the survivor)
        wait_until(lambda: _serving(store) > before, 30, "a version published while a replica was down")
        latest = wait_until(lambda: _converged(fleet, store), 150, "Serve restarting the killed replica")
        rows = {r["id"]: r for r in _replicas(fleet)}
        up = [r for r in rows.values() if r["state"] == "up"]
        assert victim["id"] not in {r["id"] for r in up} and all(r["serving_version"] == latest for r in up)
        wait_until(lambda: {r["id"]: r["state"] for r in _replicas(fleet)}.get(victim["id"]) == "down", 10, "the killed replica shown down")
    finally:
        store.close()


def test_a_rollback_and_a_pause_reach_every_replica(fleet, model_dir, tmp_path):
    store = Store(StoreConfig(url=fleet.store_url))
    try:
        serving = wait_until(lambda: _converged(fleet, store), 15, "a converged fleet")
        for _ in range(3):  # the learner may still publish what the last ratings taught: 409 serving_changed
            target = store.versions.get_version(serving).parent
            r = httpx.post(fleet.base_url + "/admin/rollback", headers=ADMIN, json={"version": target, "expect_serving": serving}, timeout=60)
            if r.status_code != 409:
                break
            serving = wait_until(lambda: _converged(fleet, store), 15, "a converged fleet")
        assert r.status_code == 200, r.text
        wait_until(lambda: _converged(fleet, store) == target, 10, f"both replicas rolled back to v{target}")
        seen = _chats(fleet, 10)  # unrated: the learner has nothing new to train on
        assert {v for _, v in seen} == {target} and len({r for r, _ in seen}) == 2, seen
        # a pause holds back every replica's activation; resuming lets both serve the published version
        assert httpx.post(fleet.base_url + "/admin/learning/pause", headers=ADMIN, json={"reason": "test"}, timeout=30).status_code == 200
        time.sleep(1.0)  # a step the learner was taking when the pause came publishes, then it stops
        current = wait_until(lambda: _converged(fleet, store), 10, "a converged fleet")
        checkpoint = perturbed_checkpoint(model_dir, tmp_path / "external", seed=7)
        pushed = store.versions.publish_version(  # what another learner (`liveloop learn`) would publish
            parent=current, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
            cursor_name="external", last_feedback_id=0,
        ).version
        time.sleep(2.0)  # 40 watch intervals
        assert _up(fleet) == {rid: current for rid in _up(fleet)} and store.versions.get_version(pushed).status == S.PUBLISHED
        assert httpx.post(fleet.base_url + "/admin/learning/resume", headers=ADMIN, timeout=30).status_code == 200
        wait_until(lambda: set(_up(fleet).values()) == {pushed} and len(_up(fleet)) == 2, 15, f"both replicas serving v{pushed}")
    finally:
        store.close()
