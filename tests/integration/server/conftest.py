"""Fixtures the publisher tests share: a migrated store on each backend whose version 0 is the tiny
model (rollbacks to it load it), a live and candidate engine pair on it (the release gate's tests), and
checkpoint reads taking turns for tests that run two hf engines in
one process (replicas, leaders), rated responses whose reply tokens are given texts (alarms, leaders), and
a whole app on the hf engine under uvicorn on 127.0.0.1 (`served_app`: the edge's HTTP tests)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from liveloop.app import build_app
from liveloop.config import load_config
from liveloop.devtools import free_port, serve_in_thread, write_config
from liveloop.server.config import EngineConfig
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig


@contextlib.contextmanager
def served_app(work: Path, model_dir: Path, server_extra: str = "") -> Iterator[tuple[str, Store]]:
    """`build_app` on the hf engine and the tiny model, SQLite, monitor off, under uvicorn on 127.0.0.1
    (`server_extra`: more `[server]` keys): its base URL and its store, both closed after."""
    port = free_port()
    path, store_url = write_config(work, Path(model_dir).resolve(), "hf", port, server_extra=server_extra,
                                   extra="[monitor]\nenabled = false\n")
    srv, thread = serve_in_thread(build_app(load_config(path), Path(model_dir)), port)
    store = Store(StoreConfig(url=store_url))
    try:
        yield f"http://127.0.0.1:{port}", store
    finally:
        store.close()
        srv.should_exit = True
        thread.join(60)


@pytest.fixture
def store(store_url, model_dir):
    s = Store(StoreConfig(url=store_url))
    s.migrate()
    s.versions.ensure_base_version(str(Path(model_dir).resolve()))
    yield s
    s.close()


@pytest.fixture
async def canary_engine(model_dir):
    config = EngineConfig(backend="hf", model=str(model_dir), drain_deadline_seconds=5.0)
    engine = CanaryEngine(HFEngine(config, model_dir), lambda: HFEngine(config, model_dir), idle_seconds=10.0)
    await engine.start(version=0)
    yield engine
    await engine.close()


@pytest.fixture
def one_checkpoint_read_at_a_time(monkeypatch):
    """Replicas are processes; here two engines share one process, and transformers' from_pretrained
    (how the hf engine reads a checkpoint directory) is not thread-safe within a process (its meta-device
    initialisation is process-wide: two reads at once gave meta tensors). Reads take turns here; nothing
    else changes."""
    lock = threading.Lock()
    read = HFEngine._read_checkpoint

    def one_at_a_time(self, path):
        with lock:
            return read(self, path)

    monkeypatch.setattr(HFEngine, "_read_checkpoint", one_at_a_time)


def rate_replies(store: Store, tokenizer, version: int, replies: list[tuple[str, int]], tag: str) -> None:
    """Responses `version` served (the replies' tokens) and their thumbs, each rated by a key of its own
    (the gate and the guard count one vote per key)."""
    records = []
    for i, (text, _) in enumerate(replies):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        records.append(ResponseRecord(
            id=f"{tag}-{i}", api_key_id=f"k{i}", model="tiny", policy_version=version, endpoint="chat", prompt_ids=(1, 2, 3),
            response_ids=ids, behavior_logprobs=(-1.0,) * len(ids), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
        ))
    store.feedback.insert_responses(records)
    for i, (_, reward) in enumerate(replies):
        store.feedback.put_feedback(FeedbackRecord(f"{tag}-{i}", f"k{i}", reward))
