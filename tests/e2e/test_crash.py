"""A killed server loses no acknowledged response: every response a client received in full is in
the store after SIGKILL, with its tokens."""

from __future__ import annotations

import concurrent.futures
import os
import signal

import httpx

from .conftest import USER_KEY, open_store, start_server


def test_sigkill_keeps_every_acknowledged_response(tmp_path, model_dir):
    server = start_server(tmp_path / "srv", model_dir, "hf")
    headers = {"Authorization": f"Bearer {USER_KEY}"}

    def ask(i: int) -> tuple[str, list[int]]:
        body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": f"Tell me about rain ({i})."}],
                "max_tokens": 16, "return_token_ids": True}
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        r.raise_for_status()
        return r.json()["id"], r.json()["choices"][0]["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        acked = list(pool.map(ask, range(24)))
    os.killpg(server.proc.pid, signal.SIGKILL)  # no shutdown hook runs
    server.proc.wait(30)
    store = open_store(server)
    for rid, token_ids in acked:
        row = store.get_response(rid)
        assert row is not None, f"acknowledged response {rid} lost"
        assert row.response_ids.tolist() == token_ids
    store.close()
