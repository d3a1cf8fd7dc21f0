"""A response format whose grammar takes seconds to compile, against a real server (`build_app`: hf engine
on the tiny model, SQLite, under uvicorn on 127.0.0.1): it is stopped at `[server]
grammar_compile_seconds` and answered 400 `grammar_too_complex` naming the schema, nothing is
stored for it, and the server goes on serving constrained and free requests (a fresh checker child)."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from liveloop.devtools import USER_KEY, USER_KEY_2

from ..conftest import served_app

MODEL = "liveloop-tiny"
SLOW_PATTERN = "^(([a-z]{1,30}[0-9]{1,30}){1,30}-){1,20}$"  # 8 properties: 8 s to compile on this machine


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("grammar"), model_dir, "grammar_compile_seconds = 1.0") as served:
        yield served


def _json_format(pattern: str | None) -> dict:
    prop = {"type": "string", "maxLength": 8} if pattern is None else {"type": "string", "pattern": pattern}
    n = 1 if pattern is None else 8
    schema = {"type": "object", "properties": {f"p{i}": prop for i in range(n)}, "required": [f"p{i}" for i in range(n)]}
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _chat(base: str, key: str, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Fill it in."}], "max_tokens": 24, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120)


def test_a_grammar_past_the_compile_deadline_is_refused_and_serving_goes_on(server):
    base, store = server
    before = store.feedback.counts()["responses"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        slow = [pool.submit(_chat, base, USER_KEY, response_format=_json_format(SLOW_PATTERN)) for _ in range(2)]
        plain = pool.submit(_chat, base, USER_KEY_2)
        for f in slow:
            r = f.result()
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (error["code"], error["param"]) == ("grammar_too_complex", "response_format.json_schema.schema")
            assert "did not compile within 1 s" in error["message"]
        assert plain.result().status_code == 200
    constrained = _chat(base, USER_KEY_2, response_format=_json_format(None))
    assert constrained.status_code == 200, constrained.text
    assert store.feedback.counts()["responses"] == before + 2  # the two served replies, nothing of the refused
