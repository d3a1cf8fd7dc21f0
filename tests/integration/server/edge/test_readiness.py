"""Healthy means ready (server/edge/pipeline/readiness.py): by the time the server answers /healthz, a warm-up
generation has run through the serving pipeline and the engine (its details say so, and /metrics), none
of it logged, and the start's objects are frozen out of the garbage collector's full passes; the first
reply after /healthz says ok is served. A real server: `build_app` (hf engine on the tiny model,
SQLite) under uvicorn on 127.0.0.1, whose lifespan has finished when `serve_in_thread` returns. (That
/healthz answers nothing before the warm-up is uvicorn's: it serves no request before the lifespan's
start has finished.)"""

from __future__ import annotations

import gc
from pathlib import Path

import httpx

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import ADMIN_KEY, USER_KEY, free_port, serve_in_thread, write_config
from liveloop.server.edge.pipeline.readiness import WARM_UP_REQUESTS, WARM_UP_TOKENS
from liveloop.store import Store, StoreConfig


def test_healthy_means_warmed_up_and_the_first_reply_is_served(tmp_path, model_dir):
    port = free_port()
    path, store_url = write_config(tmp_path, Path(model_dir).resolve(), "hf", port, extra="[monitor]\nenabled = false\n")
    srv, thread = serve_in_thread(build_app(load_config(path), Path(model_dir)), port)
    base, admin = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        assert gc.get_freeze_count() > 0  # the start's heap is out of the collector's full passes
        health = httpx.get(base + "/healthz", headers=admin, timeout=30).json()
        assert health["status"] == "ok"
        warm = health["warm_up"]
        assert warm["done"] and warm["error"] is None and warm["seconds"] > 0
        assert warm["tokens"] == WARM_UP_REQUESTS * WARM_UP_TOKENS  # ignore_eos: each the length asked
        metrics = httpx.get(base + "/metrics", headers=admin, timeout=30).text
        assert "liveloop_server_warm_up_seconds" in metrics
        first = httpx.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120,
                           json={"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4})
        assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] > 0
    finally:
        srv.should_exit = True
        thread.join(60)
    assert gc.get_freeze_count() == 0  # thawed at the stop
    store = Store(StoreConfig(url=store_url))
    try:  # the warm-up logged nothing: the one response stored is the user's
        assert store.feedback.counts()["responses"] == 1 and store.feedback.get_response(first.json()["id"]) is not None
    finally:
        store.close()
