"""Clients that vanish at every stage of a request, while another user keeps chatting, on the embedded
default engine (vLLM): nothing hangs, nothing leaks (generation slots return to zero, a swap still
completes), and every response that was generated is logged exactly once.

The stages: before the first byte of the answer, after the stream's first (role) chunk, right after
the token chunk of a one-token answer (the server is committing then: the case that used to kill the
store's writer thread), and non-streaming clients that hang up before the answer. Connections are
reset (SO_LINGER 0), as a phone that loses signal does.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from liveloop import devtools
from liveloop.devtools import wait_until

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, metric, open_store, raw_request, read_events, reset, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
CHAT = "/v1/chat/completions"


def _vanish(base_url: str, stage: str, i: int) -> str | None:
    """One client that goes away at `stage`; returns the response id if it saw one."""
    stream = stage != "non_stream"
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me about storms ({i})."}],
            "max_tokens": 1 if stage == "after_token" else 8, "stream": stream}
    sock = raw_request(base_url, CHAT, body, USER_KEY)
    if stage in ("before_first_byte", "non_stream"):
        reset(sock)
        return None
    seen = read_events(sock, 1 if stage == "after_role_chunk" else 2)
    reset(sock)
    found = re.search(rb'"id":"(chatcmpl-[0-9a-f]+)"', seen)
    return found.group(1).decode() if found else None



@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, model_dir):
    """Its own server: this test swaps weights, which the shared one must not see."""
    server = start_server(tmp_path_factory.mktemp("vanishing"), model_dir, "vllm")
    yield server
    stop_server(server)


def test_vanishing_clients_lose_nothing_and_wedge_nothing(vllm_server, tmp_path):
    base = vllm_server.base_url
    before = open_store(vllm_server).feedback.counts()["responses"]
    honest: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def honest_user() -> None:  # bounded: stops when the vanishing clients are done (at most 200 requests)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {USER_KEY_2}"}, timeout=60) as client:
            for i in range(200):
                if stop.is_set():
                    return
                r = client.post(CHAT, json={"model": "liveloop-tiny", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": f"Hello ({i})"}]})
                rid = r.json().get("id") if r.status_code == 200 else None
                honest.append((r.status_code, rid))
                if rid:
                    fb = client.post("/v1/feedback", json={"response_id": rid, "reward": i % 2})
                    honest.append((fb.status_code, None))

    user = threading.Thread(target=honest_user)
    user.start()
    seen_ids: list[str] = []
    stages = ["after_token"] * 150 + ["after_role_chunk", "before_first_byte", "non_stream"] * 30
    sent = 0
    try:
        for i, stage in enumerate(stages):
            rid = _vanish(base, stage, i)
            sent += 1
            if rid:
                seen_ids.append(rid)
    finally:
        stop.set()
        user.join(120)
    assert not user.is_alive()
    assert honest and all(code == 200 for code, _ in honest), [c for c in honest if c[0] != 200][:5]
    # nothing leaks: every generation slot comes back, the writer drains, the server is healthy
    wait_until(lambda: metric(base, "liveloop_server_generations_running") == 0, 60, "generation slots to be released")
    wait_until(lambda: metric(base, "liveloop_store_writer_queued") == 0, 60, "the writer to drain")
    health = httpx.get(base + "/healthz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    assert health.status_code == 200 and health.json()["writer"]["ok"] and health.json()["store"]["ok"]
    # the engine's gate is free: a swap completes and new requests are served by the new version
    ckpt = devtools.perturbed_checkpoint(vllm_server.model_dir, tmp_path / "ckpt", seed=11)
    swap = httpx.post(base + "/admin/weights", json={"path": str(ckpt)}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)
    assert swap.status_code == 200, swap.text
    after = httpx.post(base + CHAT, json={"model": "liveloop-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                       headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=60)
    assert after.status_code == 200 and after.json()["policy_version"] == swap.json()["version"]
    # every generated response is logged exactly once (ids are primary keys: once at most)
    store = open_store(vllm_server)
    assert len(seen_ids) >= 150
    missing = [rid for rid in seen_ids if store.feedback.get_response(rid) is None]
    assert not missing, f"{len(missing)} responses of vanished clients were not logged"
    acknowledged = [rid for code, rid in honest if rid]
    assert all(store.feedback.get_response(rid) is not None for rid in acknowledged)
    logged = store.feedback.counts()["responses"] - before
    assert len(seen_ids) + len(acknowledged) + 1 <= logged <= sent + len(acknowledged) + 1
    store.close()
