"""Every malformed request gets an OpenAI-style JSON error with the right 4xx status, never a 500,
and writes nothing."""

from __future__ import annotations

import httpx
import pytest

from .conftest import ADMIN_KEY, USER_KEY, USER_KEY_2, open_store

MODEL = "liveloop-tiny"
MSG = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


def chat(**kw):
    return {"model": MODEL, "messages": MSG, **kw}


CASES = [
    # (name, method, path, key, body (dict -> json, str/bytes -> raw), status, param fragment)
    ("invalid json", "POST", CHAT, USER_KEY, b"{not json", 400, None),
    ("body not an object", "POST", CHAT, USER_KEY, b"[1, 2]", 400, None),
    ("missing messages", "POST", CHAT, USER_KEY, {"model": MODEL}, 400, "messages"),
    ("missing model", "POST", CHAT, USER_KEY, {"messages": MSG}, 400, "model"),
    ("messages wrong type", "POST", CHAT, USER_KEY, chat(messages="hi"), 400, "messages"),
    ("bad role", "POST", CHAT, USER_KEY, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages"),
    ("empty messages", "POST", CHAT, USER_KEY, chat(messages=[]), 400, "messages"),
    ("unknown model", "POST", CHAT, USER_KEY, {"model": "gpt-9", "messages": MSG}, 404, "model"),
    ("prompt too long", "POST", CHAT, USER_KEY, chat(messages=[{"role": "user", "content": "cat " * 2000}]), 400, "messages"),
    ("max_tokens zero", "POST", CHAT, USER_KEY, chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", "POST", CHAT, USER_KEY, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_tokens too large", "POST", CHAT, USER_KEY, chat(max_tokens=100_000), 400, "max_tokens"),
    ("max_tokens past context", "POST", CHAT, USER_KEY, chat(max_tokens=510), 400, "max_tokens"),
    ("max_tokens wrong type", "POST", CHAT, USER_KEY, chat(max_tokens="ten"), 400, "max_tokens"),
    ("temperature negative", "POST", CHAT, USER_KEY, chat(temperature=-0.5), 400, "temperature"),
    ("top_p out of range", "POST", CHAT, USER_KEY, chat(top_p=1.5), 400, "top_p"),
    ("n past 16", "POST", CHAT, USER_KEY, chat(n=17), 400, "n"),
    ("unknown field", "POST", CHAT, USER_KEY, chat(functions=[]), 400, "functions"),
    ("forced call without tools", "POST", CHAT, USER_KEY, chat(tool_choice="required"), 400, "tool_choice"),
    ("stop token id out of vocab", "POST", CHAT, USER_KEY, chat(stop_token_ids=[2**31 - 1]), 400, "stop_token_ids"),
    ("top_k below -1", "POST", CHAT, USER_KEY, chat(top_k=-2), 400, "top_k"),
    ("repetition penalty zero", "POST", CHAT, USER_KEY, chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("ignore_eos under a grammar", "POST", CHAT, USER_KEY, chat(response_format={"type": "json_object"}, ignore_eos=True), 400, "ignore_eos"),
    ("a JSON schema xgrammar cannot follow", "POST", CHAT, USER_KEY,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a|b)*c{1000}"}}}), 400,
     "response_format"),
    ("too many stops", "POST", CHAT, USER_KEY, chat(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("top_logprobs without logprobs", "POST", CHAT, USER_KEY, chat(top_logprobs=2), 400, None),
    ("completion token id out of vocab", "POST", "/v1/completions", USER_KEY, {"model": MODEL, "prompt": [10**7]}, 400, "prompt"),
    ("completion empty prompt", "POST", "/v1/completions", USER_KEY, {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("no api key", "POST", CHAT, None, chat(), 401, None),
    ("wrong api key", "POST", CHAT, "sk-nope", chat(), 401, None),
    ("models without key", "GET", "/v1/models", None, None, 401, None),
    ("admin route with user key", "GET", "/admin/versions", USER_KEY, None, 403, None),
    ("admin swap with user key", "POST", "/admin/weights", USER_KEY, {"path": "/tmp"}, 403, None),
    ("admin swap of a non-checkpoint", "POST", "/admin/weights", ADMIN_KEY, {"path": "/nonexistent"}, 400, "path"),
    ("oversized body", "POST", CHAT, USER_KEY, chat(messages=[{"role": "user", "content": "x" * 70_000}]), 413, None),
    ("feedback unknown id", "POST", "/v1/feedback", USER_KEY, {"response_id": "chatcmpl-nope", "reward": 1}, 404, "response_id"),
    ("feedback bad reward", "POST", "/v1/feedback", USER_KEY, {"response_id": "x", "reward": 5}, 400, "reward"),
    ("feedback reward word", "POST", "/v1/feedback", USER_KEY, {"response_id": "x", "reward": "meh"}, 400, "reward"),
    ("feedback bool reward", "POST", "/v1/feedback", USER_KEY, {"response_id": "x", "reward": True}, 400, "reward"),
    ("feedback missing id", "POST", "/v1/feedback", USER_KEY, {"reward": 1}, 400, "response_id"),
    ("unknown route", "GET", "/v1/nothing", USER_KEY, None, 404, None),
    ("wrong method", "PUT", CHAT, USER_KEY, None, 405, None),
]


def _send(base_url, method, path, key, body):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (bytes, str)):
        return httpx.request(method, base_url + path, content=body, headers={**headers, "content-type": "application/json"}, timeout=60)
    return httpx.request(method, base_url + path, json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("name, method, path, key, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_openai_error(vllm_server, name, method, path, key, body, status, param):
    store = open_store(vllm_server)
    before = store.feedback.counts()
    r = _send(vllm_server.base_url, method, path, key, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param:
        assert param in (err["param"] or "") or param in err["message"]
    assert store.feedback.counts() == before, "a rejected request must write nothing"
    store.close()


def test_rating_another_keys_response_is_404_and_keeps_the_rating(vllm_server):
    r = _send(vllm_server.base_url, "POST", CHAT, USER_KEY, chat(max_tokens=4))
    rid = r.json()["id"]
    assert _send(vllm_server.base_url, "POST", "/v1/feedback", USER_KEY, {"response_id": rid, "reward": 1}).status_code == 200
    r2 = _send(vllm_server.base_url, "POST", "/v1/feedback", USER_KEY_2, {"response_id": rid, "reward": 0})
    assert r2.status_code == 404
    # indistinguishable from an id that does not exist: ids do not leak
    r3 = _send(vllm_server.base_url, "POST", "/v1/feedback", USER_KEY_2, {"response_id": "chatcmpl-x", "reward": 0})
    assert r2.json()["error"]["type"] == r3.json()["error"]["type"]
    store = open_store(vllm_server)
    assert [f.reward for f in store.feedback.get_feedback(rid)] == [1]
    store.close()


def test_admin_key_reaches_admin_routes(vllm_server):
    r = _send(vllm_server.base_url, "GET", "/admin/versions", ADMIN_KEY, None)
    assert r.status_code == 200 and r.json()["data"][0]["version"] == 0
