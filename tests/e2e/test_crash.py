"""Faults of the whole server and of its store.

- SIGKILL of the server while clients chat and rate: every response and rating a client got a 200
  for is in the store afterwards, with its tokens, and a restarted server serves on the same store.
- The store goes away (PostgreSQL refuses connections) and comes back: meanwhile clear 503s with
  Retry-After and a 503 /healthz, no acknowledged loss, and recovery without a restart.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, open_store, start_server, stop_server

MSG = [{"role": "user", "content": "Tell me about rain."}]


def _user(server, key: str, acked_responses: dict, acked_ratings: dict, stop: threading.Event, i0: int) -> None:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        for i in range(i0, i0 + 500):  # bounded; the kill ends it sooner
            if stop.is_set():
                return
            try:
                r = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 8,
                                                         "return_token_ids": True, "seed": i})
                if r.status_code != 200:
                    continue
                rid = r.json()["id"]
                acked_responses[rid] = r.json()["choices"][0]["token_ids"]
                fb = c.post("/v1/feedback", json={"response_id": rid, "reward": i % 2})
                if fb.status_code == 200:
                    acked_ratings[rid] = i % 2
            except httpx.HTTPError:
                return  # the server is gone


def test_sigkill_during_writes_keeps_every_acknowledged_row(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf")
    responses: dict[str, list[int]] = {}
    ratings: dict[str, int] = {}
    stop = threading.Event()
    users = [threading.Thread(target=_user, args=(server, k, responses, ratings, stop, 1000 * n))
             for n, k in enumerate([USER_KEY, USER_KEY_2, USER_KEY, USER_KEY_2])]
    for u in users:
        u.start()
    deadline = time.monotonic() + 120
    while len(ratings) < 30 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(server.proc.pid, signal.SIGKILL)  # mid-flight: no shutdown hook runs
    server.proc.wait(30)
    stop.set()
    for u in users:
        u.join(60)
    assert len(ratings) >= 30
    store = open_store(server)
    for rid, token_ids in responses.items():
        row = store.feedback.get_response(rid)
        assert row is not None, f"acknowledged response {rid} lost"
        assert row.response_ids.tolist() == token_ids
    for rid, reward in ratings.items():
        assert [f.reward for f in store.feedback.get_feedback(rid)] == [reward], f"acknowledged rating of {rid} lost"
    store.close()
    # a restarted server comes up on the same store and serves
    again = start_server(tmp_path / "srv", model_dir, "hf", store_url=server.store_url)
    try:
        with httpx.Client(base_url=again.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=30) as c:
            assert c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4}).status_code == 200
    finally:
        stop_server(again)


@pytest.fixture
def pg_database():
    base = os.environ.get("LIVELOOP_TEST_PG_URL")
    if not base:
        if os.environ.get("LIVELOOP_REQUIRE_PG"):
            pytest.fail("LIVELOOP_REQUIRE_PG is set but LIVELOOP_TEST_PG_URL is not")
        pytest.skip("no PostgreSQL: run through scripts/test.sh")
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = base.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield base.rsplit("/", 1)[0] + "/" + name, admin, name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_store_outage_gives_503s_and_recovers_without_restart(tmp_path, model_dir, pg_database):
    import psycopg

    url, admin, name = pg_database
    server = start_server(tmp_path / "srv", model_dir, "hf", store_url=url)
    acked: list[str] = []
    try:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60) as c:
            def chat() -> httpx.Response:
                r = c.post("/v1/chat/completions", json={"model": "liveloop-tiny", "messages": MSG, "max_tokens": 4})
                if r.status_code == 200:
                    acked.append(r.json()["id"])
                return r

            assert chat().status_code == 200
            # the store goes away: no new connections, and the open ones are cut
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
                conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
            down = [chat() for _ in range(3)]
            assert all(r.status_code == 503 and int(r.headers["retry-after"]) >= 1 for r in down), [r.text for r in down]
            assert all(r.json()["error"]["message"] for r in down)
            health = httpx.get(server.base_url + "/healthz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)  # with the details
            assert health.status_code == 503 and not health.json()["store"]["ok"]
            fb = c.post("/v1/feedback", json={"response_id": acked[0], "reward": 1})
            assert fb.status_code == 503
            # it comes back: the same server process recovers
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            deadline = time.monotonic() + 60
            while chat().status_code != 200 and time.monotonic() < deadline:
                time.sleep(1)
            assert httpx.get(server.base_url + "/healthz", timeout=30).status_code == 200
            assert c.post("/v1/feedback", json={"response_id": acked[0], "reward": 1}).status_code == 200
            assert server.proc.poll() is None
        store = open_store(server)
        assert all(store.feedback.get_response(rid) is not None for rid in acked)  # no acknowledged loss
        store.close()
    finally:
        stop_server(server)
