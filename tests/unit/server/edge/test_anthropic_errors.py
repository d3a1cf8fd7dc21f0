"""Anthropic's endpoint answers errors in Anthropic's shape (server/edge/errors.py), through a real FastAPI
app with the server's handlers: every domain exception keeps its status with the Anthropic error type
of that status, validation failures and unknown methods too, an unmapped exception is an `api_error`
500; other routes keep OpenAI's shape."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import install_handlers
from liveloop.server.edge.messages.protocol import MessagesRequest

from .test_errors import EXPECTED

ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 409: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error"}


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    install_handlers(app)
    raising: dict[str, BaseException] = {}

    @app.post("/v1/messages")
    async def _messages(request: Request):
        if name := request.query_params.get("raise"):
            raise raising[name]
        await parse_body(request, MessagesRequest)
        return {}

    @app.post("/v1/chat/completions")
    async def _chat(request: Request):
        raise raising[request.query_params["raise"]]

    app.state.raising = raising
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _raise(client: TestClient, exc: BaseException, path: str = "/v1/messages"):
    name = f"{type(exc).__name__}-{id(exc)}"
    client.app.state.raising[name] = exc
    return client.post(path, params={"raise": name}, json={})


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_domain_exceptions_answer_in_anthropics_shape(client, cls):
    exc, status, _, _, _, message, retry_after = EXPECTED[cls]
    r = _raise(client, exc)
    assert r.status_code == status
    assert r.json() == {"type": "error", "error": {"type": ANTHROPIC_TYPES[status], "message": message}}
    assert r.headers.get("retry-after") == retry_after


def test_unmapped_exception_is_an_api_error_and_other_routes_keep_openais_shape(client):
    r = _raise(client, RuntimeError("a bug"))
    assert r.status_code == 500 and r.json() == {"type": "error", "error": {"type": "api_error", "message": "internal server error"}}
    r = _raise(client, RuntimeError("a bug"), "/v1/chat/completions")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_bad_bodies_and_methods_are_invalid_request_errors(client):
    ask = [{"role": "user", "content": "hi"}]
    for body, fragment in (
        (b"{not json", "invalid JSON"),
        ({"model": "m", "messages": ask}, "max_tokens"),
        ({"model": "m", "max_tokens": 4, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}, "tool_result"),
        ({"model": "m", "max_tokens": 4, "messages": ask, "system": [{"type": "image"}]}, "image"),
        ({"model": "m", "max_tokens": 4, "messages": ask, "stop_sequences": ["a"] * 5}, "stop"),
        ({"model": "m", "max_tokens": 4, "messages": ask, "metadata": {"user_id": "u", "plan": "x"}}, "metadata"),
        ({"model": "m", "max_tokens": 4, "messages": ask, "top_p": 0}, "top_p"),
    ):
        r = client.post("/v1/messages", **({"content": body} if isinstance(body, bytes) else {"json": body}))
        assert r.status_code == 400, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert fragment in r.json()["error"]["message"], r.text
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


def test_the_request_reads_system_blocks_metadata_and_stops():
    req = MessagesRequest.model_validate_json(
        '{"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind.", "cache_control": {"type": "ephemeral"}}],'
        ' "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "metadata": {"user_id": "u-1"}, "stop_sequences": ["\\n\\n"]}'
    )
    assert req.system_text() == "Be kind." and req.messages[0].text() == "hi"
    assert req.user() == "u-1" and req.stops() == ["\n\n"] and req.temperature == 1.0 and not req.stream
