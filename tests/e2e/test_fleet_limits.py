"""Fleet-wide limits, as an attacker with two replicas in front of them meets them: two real `liveloop
serve` processes (hf engine, 127.0.0.1) on ONE store, SQLite and PostgreSQL, `[server] fleet_limits` as
shipped (on), syncing every 0.1 s.

- one key alternating its chats between the two servers is refused (429, Retry-After) at about its
  per-minute limit, not at twice it, and then by both; the same for its ratings;
- failed dashboard sign-ins alternating between the servers are refused at about the per-client
  limit; guesses from more addresses (127.0.0.2, ...) spread over both meet the total once.

"About": the documented bound (server/edge/fleet_limits.py) lets the fleet pass a limit by what the
other replica admitted since its last sync was read, here one or two requests sent one at a time; the
per-replica limits of before admit exactly twice the limit."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEY_2, ServerProcess, wait_until
from ..conftest import fresh_pg_database
from .conftest import start_server, stop_server

pytestmark = pytest.mark.slow

RATE = 16  # chats (and ratings) per key per minute, fleet-wide
PER_CLIENT, TOTAL = 6, 12  # failed sign-ins per minute: per client address, all together
# what the other server may answer before this one reads its count (a sync every 0.1 s, requests one at a time:
# 1 or 2 here, more on a loaded machine) is bounded by the sync, not by the limit; the per-replica limits of
# before let exactly twice each limit through, so "fewer than twice" is what tells the two apart
SETTLED = 0.6  # seconds: several syncs, after which each server has read what the other pushed
LIMITS = f"""
chat_requests_per_minute = {RATE}
feedback_per_minute = {RATE}
login_failures_per_minute = {PER_CLIENT}
login_failures_per_minute_total = {TOTAL}
limits_sync_seconds = 0.1
"""


@contextlib.contextmanager
def _store_url(backend: str, tmp: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'fleet.db'}"
        return
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fleet(request, tmp_path_factory, model_dir) -> Iterator[list[ServerProcess]]:
    """Two servers on one store (the first migrates it; the second starts once it serves)."""
    tmp = tmp_path_factory.mktemp(f"fleet-{request.param}")
    with _store_url(request.param, tmp) as url, contextlib.ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            server = start_server(tmp / name, model_dir, "hf", store_url=url, rate_limits=True, server_extra=LIMITS)
            stack.callback(stop_server, server)
            servers.append(server)
        yield servers


def _chat(server: ServerProcess, key: str) -> httpx.Response:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _rate(server: ServerProcess, key: str) -> httpx.Response:
    body = {"response_id": "chatcmpl-none", "reward": 1}
    return httpx.post(server.base_url + "/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _sign_in(server: ServerProcess, key: str, source: str = "127.0.0.1") -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=60) as client:
        return client.post(server.base_url + "/dashboard/login", data={"key": key})


def _until_refused(send, servers: list[ServerProcess], tries: int) -> tuple[int, httpx.Response]:
    """Send to the servers in turn until one answers 429: how many were answered before it, and the 429."""
    for i in range(tries):
        r = send(servers[i % 2])
        if r.status_code == 429:
            return i, r
    pytest.fail(f"never refused in {tries} requests spread over {len(servers)} servers")


def _refused_for_a_while(r: httpx.Response) -> None:
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    assert 1 <= int(r.headers["retry-after"]) <= 71, r.headers


def test_a_key_alternating_between_servers_meets_its_limit_once(fleet):
    served, refused = _until_refused(lambda s: _chat(s, USER_KEY), fleet, 2 * RATE + 2)
    assert RATE <= served < 2 * RATE, f"{served} chats served, limit {RATE} a minute fleet-wide"
    _refused_for_a_while(refused)
    wait_until(lambda: all(_chat(s, USER_KEY).status_code == 429 for s in fleet), 10, "both servers refusing the key")
    for server in fleet:  # and both servers refuse it now
        _refused_for_a_while(_chat(server, USER_KEY))
    assert _chat(fleet[0], USER_KEY_2).status_code == 200  # another key has its own count

    rated, refused = _until_refused(lambda s: _rate(s, USER_KEY_2), fleet, 2 * RATE + 2)
    assert RATE <= rated < 2 * RATE, f"{rated} ratings answered, limit {RATE} a minute fleet-wide"
    _refused_for_a_while(refused)


def test_failed_sign_ins_spread_over_servers_meet_one_throttle(fleet):
    failed, refused = _until_refused(lambda s: _sign_in(s, "wrong"), fleet, 2 * PER_CLIENT + 2)
    assert PER_CLIENT <= failed < 2 * PER_CLIENT, f"{failed} failed sign-ins from one address before a 429"
    _refused_for_a_while(refused)
    time.sleep(SETTLED)  # not a probe: a sign-in admitted meanwhile would change the counts below
    for server in fleet:
        assert _sign_in(server, ADMIN_KEY).status_code == 429  # the right key waits too
    # more addresses, spread over both servers: the total holds (failures so far count)
    sources = iter(f"127.0.0.{i}" for i in range(2, 2 * TOTAL + 2))
    more, refused = _until_refused(lambda s: _sign_in(s, "wrong", next(sources)), fleet, 2 * TOTAL)
    assert TOTAL <= failed + more < 2 * TOTAL, f"{failed + more} failed sign-ins in all before a 429"
    _refused_for_a_while(refused)
