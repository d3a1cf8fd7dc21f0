"""Serve's proxy queue is bounded (liveloop/serve_ray.py `deployment_options`, `[ray]
max_queued_requests`): `liveloop serve --config ray` in its own process (a private local Ray, one
replica with its hf engine, no learner, SQLite) sent at most one request at once (`max_ongoing_requests
= 1`) and holding at most two waiting: of eight chats sent together, those past the bound are answered
503 with Retry-After at once, reach no replica (nothing is logged of them), and the rest are served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from liveloop.devtools import USER_KEYS
from liveloop.store import Store, StoreConfig

from .conftest import start_server, stop_server

pytestmark = [pytest.mark.slow]

BOUNDED = """
[ray]
replicas = 1
num_cpus = 1
replica_cpus = 1
max_ongoing_requests = 1
max_queued_requests = 2
[monitor]
enabled = false
"""
SENT = 8
LONG = {"max_tokens": 450, "ignore_eos": True, "temperature": 1.0}  # near the tiny model's 512 positions: seconds each


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, model_dir):
    work = tmp_path_factory.mktemp("ray-bounded")
    server = start_server(work, model_dir, "hf", extra=BOUNDED, extends=["ray", "tiny"], store_url=f"sqlite:///{work / 'liveloop.db'}", timeout=420)
    yield server
    stop_server(server)


def _chat(base_url: str, n: int) -> tuple[int, float, float, httpx.Headers, str]:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me a long story, number {n}."}], **LONG}
    started = time.monotonic()
    r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {USER_KEYS[n % len(USER_KEYS)]}"})
    return r.status_code, started, time.monotonic(), r.headers, r.json().get("id", "") if r.status_code == 200 else ""


def test_requests_past_the_proxy_queue_get_503_and_reach_no_replica(fleet):
    with ThreadPoolExecutor(SENT) as pool:
        results = list(pool.map(lambda n: _chat(fleet.base_url, n), range(SENT)))
    codes = sorted(code for code, *_ in results)
    served = [rid for code, _, _, _, rid in results if code == 200]
    refused = [(end - start, headers) for code, start, end, headers, _ in results if code == 503]
    # one running and two waiting at most while they arrive: a request sent after a served one came back
    # may take its freed place (a loaded machine starts the eight threads over a while), no other
    first_back = min((end for code, _, end, _, _ in results if code == 200), default=float("inf"))
    late = sum(1 for _, start, _, _, _ in results if start > first_back)
    assert set(codes) <= {200, 503} and 1 <= len(served) <= 3 + late and len(refused) >= SENT - 3 - late, (codes, late)
    assert refused, "nothing was refused: the eight did not arrive together"
    assert all(h.get("retry-after") == "1" for _, h in refused)
    slowest_served = max(end - start for code, start, end, _, _ in results if code == 200)
    assert max(seconds for seconds, _ in refused) < slowest_served  # refused at once, not after a wait
    store = Store(StoreConfig(url=fleet.store_url))
    try:
        assert store.feedback.counts()["responses"] == len(served)  # a refused request never reached the replica
        assert all(store.feedback.get_response(rid) is not None for rid in served)
    finally:
        store.close()
