"""A whole response with many choices of per-token top logprobs is built off the event loop
(server/edge/pipeline/streaming.py, past INLINE_ENTRIES), and either way says what the store logged:
against a real server (`build_app`: hf engine on the tiny model, SQLite, under uvicorn on 127.0.0.1)."""

from __future__ import annotations

import threading

import httpx
import pytest

from liveloop.devtools import USER_KEY
from liveloop.server.edge.formats.openai import OpenAIFormat
from liveloop.server.edge.pipeline import streaming

from ..conftest import served_app

BODY = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 64,
        "n": 4, "logprobs": True, "top_logprobs": 20, "seed": 7, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("large-bodies"), model_dir) as served:
        yield served


def _chat(base: str) -> dict:
    r = httpx.post(base + "/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {USER_KEY}"}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_large_whole_response_is_built_off_the_loop_and_says_what_was_logged(server, monkeypatch):
    base, store = server
    built_on: list[str] = []
    whole = OpenAIFormat.whole

    def spy(self, runs):  # notes the thread the body is built on, and builds it as before
        built_on.append(threading.current_thread().name)
        return whole(self, runs)

    monkeypatch.setattr(OpenAIFormat, "whole", spy)
    monkeypatch.setattr(streaming, "INLINE_ENTRIES", 10**9)
    inline = _chat(base)
    monkeypatch.setattr(streaming, "INLINE_ENTRIES", 4096)
    off = _chat(base)
    entries = sum(len(c["logprobs"]["content"]) * 21 for c in off["choices"])
    assert entries > 4096 and len(off["choices"]) == 4  # past the bound: built on the prompt thread
    assert built_on[0] != built_on[1] and built_on[1].startswith("liveloop-prompts"), built_on
    for body in (inline, off):  # either way, each choice's body is what the store logged of it
        for c in body["choices"]:
            stored = store.feedback.get_response(c["response_id"])
            content = c["logprobs"]["content"]
            assert [t["logprob"] for t in content] == pytest.approx(list(stored.behavior_logprobs), abs=1e-6)
            assert len(content) == len(stored.response_ids) and all(len(t["top_logprobs"]) == 20 for t in content)
    assert [c["message"] for c in off["choices"]] == [c["message"] for c in inline["choices"]]  # the same seeds
