"""`return_token_ids` (vLLM's extension) on all four generating endpoints, whole and streamed, against a
real server (`build_app`: hf engine on the tiny model, SQLite, under uvicorn on 127.0.0.1): the ids a
trainer that is not liveloop's reads are the engine's own, those the store logged; and those ids go
back in as a completion's prompt unchanged."""

from __future__ import annotations

import json

import httpx
import pytest

from liveloop.devtools import USER_KEY

from ..conftest import served_app

MODEL = "liveloop-tiny"
HEADERS = {"authorization": f"Bearer {USER_KEY}", "x-api-key": USER_KEY, "anthropic-version": "2023-06-01"}
ASK = [{"role": "user", "content": "Tell me about the sea."}]
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": ASK, "max_tokens": 6},
    "/v1/completions": {"model": MODEL, "prompt": "The sea is", "max_tokens": 6},
    "/v1/responses": {"model": MODEL, "input": ASK, "max_output_tokens": 6},
    "/v1/messages": {"model": MODEL, "messages": ASK, "max_tokens": 6},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    with served_app(tmp_path_factory.mktemp("token-ids"), model_dir) as served:
        yield served


def _ids(path: str, body: dict) -> tuple[str, list[int], list[int]]:
    """The response id, prompt ids and reply ids a whole response carries."""
    if path == "/v1/chat/completions" or path == "/v1/completions":
        return body["id"], body["prompt_token_ids"], body["choices"][0]["token_ids"]
    return body["id"], body["prompt_token_ids"], body["token_ids"]


def _streamed(path: str, events: list[dict]) -> tuple[str, list[int], list[int]]:
    """The same from a stream: chat and completions per chunk (prompt ids on the first), the Responses
    API on its completed response, Messages on its message_delta."""
    if path in ("/v1/chat/completions", "/v1/completions"):
        ids = [t for e in events for c in e.get("choices", []) for t in c.get("token_ids") or []]
        # chat: on the first chunk; completions: on each choice's first chunk (vLLM's places)
        prompts = [e["prompt_token_ids"] for e in events if "prompt_token_ids" in e]
        prompts += [c["prompt_token_ids"] for e in events for c in e.get("choices", []) if "prompt_token_ids" in c]
        assert len(prompts) == 1, prompts
        return events[0]["id"], prompts[0], ids
    if path == "/v1/responses":
        done = next(e["response"] for e in events if e.get("type") in ("response.completed", "response.incomplete"))
        return done["id"], done["prompt_token_ids"], done["token_ids"]
    start = next(e["message"] for e in events if e.get("type") == "message_start")
    delta = next(e for e in events if e.get("type") == "message_delta")
    return start["id"], delta["prompt_token_ids"], delta["token_ids"]


@pytest.mark.parametrize("path", list(BODIES))
def test_token_ids_are_the_logged_ones(server, path):
    base, store = server
    r = httpx.post(base + path, json={**BODIES[path], "return_token_ids": True, "seed": 1}, headers=HEADERS, timeout=120)
    assert r.status_code == 200, r.text
    response_id, prompt, reply = _ids(path, r.json())
    with httpx.stream("POST", base + path, json={**BODIES[path], "return_token_ids": True, "seed": 1, "stream": True},
                      headers=HEADERS, timeout=120) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    streamed_id, streamed_prompt, streamed_reply = _streamed(path, events)
    for rid, p, t in ((response_id, prompt, reply), (streamed_id, streamed_prompt, streamed_reply)):
        row = store.feedback.get_response(rid)
        assert row.prompt_ids.tolist() == p and row.response_ids.tolist() == t and len(t) > 0
    # without the flag, no ids
    plain = httpx.post(base + path, json=BODIES[path], headers=HEADERS, timeout=120).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain


def test_returned_ids_go_back_in_as_a_prompt(server):
    base, store = server
    first = httpx.post(base + "/v1/responses", json={**BODIES["/v1/responses"], "return_token_ids": True}, headers=HEADERS, timeout=120).json()
    again = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": first["prompt_token_ids"] + first["token_ids"],
                                                       "max_tokens": 4, "return_token_ids": True}, headers=HEADERS, timeout=120)
    assert again.status_code == 200, again.text
    assert again.json()["prompt_token_ids"] == first["prompt_token_ids"] + first["token_ids"]
