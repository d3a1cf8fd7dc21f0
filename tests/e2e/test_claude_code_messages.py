"""Claude Code (npm @anthropic-ai/claude-code 2.1.328) on POST /v1/messages, against the session's real
server (`vllm_server`: vLLM, the tiny model, SQLite; shared with tests/e2e/test_protocols.py): its
reachability probe (`HEAD /api/hello`, captured); its first request (captured in
tests/data/agents/claude-code-2.1.328/, shrunk to the tiny model's 512-token context: every field,
header and block type kept, long texts cut, two tools and the deferred placeholder kept, their schemas
cut to one property) through the official `anthropic` client's beta API, as Claude Code sends it
(`?beta=true`, its `anthropic-beta` list), whole and streamed, with Anthropic's event sequence; a forced
tool call and the second turn that resends it (with a thinking block, a tool result and a system turn),
whose prompt begins with the first's although the billing header changed; and count_tokens equal to
`usage.input_tokens` over every block shape."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import anthropic
import httpx
import pytest

from .conftest import USER_KEY, open_store

CAPTURED = Path(__file__).resolve().parents[1] / "data/agents/claude-code-2.1.328"
KEEP_TOOLS = ("Bash", "Read")
CUT = 14  # characters each long text keeps
NOT_COUNTED = ("max_tokens", "metadata", "stream", "service_tier", "speed", "inference_geo", "cache_control")


def _capture(name: str) -> dict:
    return json.loads((CAPTURED / name).read_text())


def _schema(schema: dict) -> dict:
    """The schema's first property alone; a string at most 8 characters (a forced call stays short)."""
    name, prop = next(iter(schema["properties"].items()))
    prop = {"type": prop["type"], **({"maxLength": 8} if prop["type"] == "string" else {})}
    return {"type": "object", "properties": {name: prop}, "required": [name]}


def shrink(body: dict) -> dict:
    body = copy.deepcopy(body)
    for block in body["system"]:
        if not block["text"].startswith("x-anthropic-billing-header"):
            block["text"] = block["text"][:CUT]
    for message in body["messages"]:
        for block in message["content"]:
            block["text"] = block["text"][:CUT]
    body["tools"] = [
        {**t, "description": t["description"][:CUT], "input_schema": t["input_schema"] if t.get("defer_loading") else _schema(t["input_schema"])}
        for t in body["tools"] if t["name"] in KEEP_TOOLS or t.get("defer_loading")
    ]
    return body


MAIN = _capture("main-request.json")
BODY = shrink(MAIN["body"])
BETAS = MAIN["headers"]["anthropic-beta"].split(",")
# Claude Code's own headers, sent along (the client adds its own anthropic-version, key and content type)
CC_HEADERS = {k: v for k, v in MAIN["headers"].items()
              if k.lower() in ("x-app", "x-claude-code-session-id", "anthropic-dangerous-direct-browser-access", "user-agent")}


def _kwargs(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "stream"}


def _counted(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in NOT_COUNTED}


@pytest.fixture(scope="module")
def server(vllm_server):
    return vllm_server


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.base_url, api_key=USER_KEY, max_retries=0, timeout=120, default_headers=CC_HEADERS) as client:
        yield client


def _count(claude, body: dict) -> int:
    return claude.beta.messages.count_tokens(betas=BETAS, **_counted(body)).input_tokens


def test_the_probe_is_answered(server):
    probe = _capture("probe.json")
    headers = {k: v for k, v in probe["headers"].items() if k.lower() != "host"}
    assert httpx.request(probe["method"], server.base_url + probe["path"], headers=headers, timeout=30).status_code == 200
    assert httpx.head(server.base_url + "/", timeout=30).status_code == 200
    assert httpx.get(server.base_url + "/api/hello", timeout=30).status_code == 200


def test_the_first_request_whole(claude):
    m = claude.beta.messages.create(betas=BETAS, **_kwargs(BODY), extra_body={"seed": 1})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert {b.type for b in m.content} <= {"text", "tool_use"}  # no thinking: the model does not think
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert m.model_extra["max_tokens_clamped"]["requested"] == 32000
    assert m.usage.input_tokens == _count(claude, BODY) and m.usage.cache_read_input_tokens == 0


def test_the_first_request_streamed_as_claude_code_reads_it(server, claude):
    with claude.beta.messages.stream(betas=BETAS, **_kwargs(BODY), extra_body={"seed": 2}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert final.usage.input_tokens == _count(claude, BODY) and final.stop_reason is not None
    # the raw events, sent as Claude Code sends the request: its path, headers and body
    headers = {**{k: v for k, v in MAIN["headers"].items() if k.lower() not in ("host", "content-length", "accept-encoding")}, "x-api-key": USER_KEY}
    with httpx.stream("POST", server.base_url + MAIN["path"], content=json.dumps(BODY), headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert data[0]["message"]["usage"]["input_tokens"] == final.usage.input_tokens
    assert data[-2]["delta"]["stop_reason"] and data[-2]["usage"]["output_tokens"] >= 1
    open_index = None
    for name, d in zip(names[1:-2], data[1:-2]):  # blocks open, take deltas and close in turn
        if name == "content_block_start":
            assert open_index is None
            open_index = d["index"]
        elif name == "content_block_delta":
            assert d["index"] == open_index and d["delta"]["type"] in ("text_delta", "input_json_delta")
        elif name == "content_block_stop":
            assert d["index"] == open_index
            open_index = None
        else:
            assert name == "ping"
    assert open_index is None


def test_a_forced_call_then_the_second_turn(server, claude):
    with claude.beta.messages.stream(betas=BETAS, **_kwargs(BODY), tool_choice={"type": "tool", "name": "Bash"}, extra_body={"seed": 3}) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        first = stream.get_final_message()
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "Bash" and use.id.startswith("toolu_") and "input_json_delta" in deltas
    assert isinstance(use.input["command"], str)
    second = copy.deepcopy(BODY)
    second["system"][0]["text"] = "x-anthropic-billing-header: cc_version=2.1.328.e01; cc_entrypoint=sdk-cli;"  # new every request
    assistant = [{"type": "thinking", "thinking": "Listing with ls.", "signature": "c2ln"}, {"type": "redacted_thinking", "data": "b3BhcXVl"},
                 *[b.model_dump(exclude_none=True) for b in first.content]]
    second["messages"] += [
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "a.txt"}],
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    ]
    reply = claude.beta.messages.create(betas=BETAS, **_kwargs(second), extra_body={"seed": 4})
    assert reply.usage.input_tokens == _count(claude, second)
    store = open_store(server)
    one, two = store.feedback.get_response(first.id), store.feedback.get_response(reply.id)
    store.close()
    assert list(two.prompt_ids[: len(one.prompt_ids)]) == list(one.prompt_ids)  # one prefix: the billing header is not in it


USE = {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}
SHAPES = {
    "captured": BODY,
    "plain": {"model": "liveloop-tiny", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi."}]},
    "system-first-no-tools": {"model": "liveloop-tiny", "max_tokens": 8, "messages": [
        {"role": "system", "content": "Env."}, {"role": "user", "content": "Hi."}, {"role": "system", "content": [{"type": "text", "text": "Later."}]}]},
    "tool-result-text": {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": [USE]},
                                              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.txt", "is_error": True}]}]},
    "tool-result-blocks-and-reference": {**BODY, "tools": [t for t in BODY["tools"] if t["name"] != "Read"], "messages": [*BODY["messages"], {"role": "assistant", "content": [{"type": "text", "text": "Searching."}, USE]},
                                                              {"role": "user", "content": [
                                                                  {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
                                                                      {"type": "text", "text": "found"}, {"type": "tool_reference", "tool_name": "DeferredToolPlaceholder"}]},
                                                                  {"type": "text", "text": "Go on."}]}]},
    "thinking": {"model": "liveloop-tiny", "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hmm.", "signature": "x"}, {"type": "redacted_thinking", "data": "y"},
                                          {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Again."}]},
    "json-format": {"model": "liveloop-tiny", "max_tokens": 8, "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
                    "messages": [{"role": "user", "content": "JSON."}], "thinking": {"type": "disabled"}},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_count_tokens_is_the_input_tokens(claude, shape):
    body = SHAPES[shape]
    m = claude.beta.messages.create(betas=BETAS, **{**_kwargs(body), "max_tokens": 1})
    assert m.usage.input_tokens == _count(claude, body)
