"""The Codex CLI's (0.169.0) traffic on POST /v1/responses against the session's real server
(`vllm_server`: vLLM, tiny model, SQLite; the protocol tests share it): a shrunk copy of its captured
first request (every field, item type, tool type and header kept, long texts cut to fit the tiny
model's context) streamed and not; a forced call of a namespaced function comes back as a
`function_call` carrying its namespace, a forced custom tool call as a `custom_tool_call` with its
`input`; the stream has the events Codex's parser reads (response.created, output items added and
done, response.completed with the usage it parses); the built-in tools are reported as ignored; a
second stateless turn resends the first turn's output items, reasoning and both kinds of tool output.
Last, generated variations of that request: never a 5xx."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import USER_KEY

CAPTURED = json.loads((Path(__file__).resolve().parents[1] / "data" / "agents" / "codex-0.169.0" / "turn1-request.json").read_text())
SKIP_HEADERS = {"host", "content-length", "authorization"}
HEADERS = {k: v for k, v in CAPTURED["headers"].items() if k not in SKIP_HEADERS} | {"authorization": f"Bearer {USER_KEY}"}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
TOOL_SEARCH = {"type": "tool_search", "execution": "client", "description": "Find more tools.",
               "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
ROOM = 96  # tokens for a forced call: a boolean argument ends well within; a freeform string may take them all
CUT = 8  # characters kept of each text and description (the tiny model's context is 512 tokens; a tool takes ~100)
KINDS = ("function", "namespace", "custom", "web_search", "tool_search")
NAMESPACED = ("namespace", "web_search", "tool_search")  # a forced call's request: its tool and the built-ins
CUSTOM = ("custom", "web_search", "tool_search")


@pytest.fixture(scope="module")
def server(vllm_server):
    return vllm_server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=120) as client:
        yield client


def _cut(value: Any) -> Any:
    """Every text and description cut to CUT characters; structure and every other value kept."""
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, dict):
        return {k: v[:CUT] if k in ("text", "description") and isinstance(v, str) else _cut(v) for k, v in value.items()}
    return value


def _small_schema(tool: dict[str, Any], keep: str) -> dict[str, Any]:
    """A function tool with one property, undescribed (the tiny model's context holds few schemas)."""
    properties = {keep: {"type": tool["parameters"]["properties"][keep]["type"]}}
    return {**tool, "parameters": {"type": "object", "properties": properties, "required": [keep]}}


def codex_body(kinds: tuple[str, ...] = KINDS, **changes: Any) -> dict[str, Any]:
    """The captured body, shrunk: every field and item kept (texts cut), one tool of each of `kinds`."""
    body = _cut(copy.deepcopy(CAPTURED["body"]))
    functions = [t for t in body["tools"] if t["type"] == "function"]
    namespace = next(t for t in body["tools"] if t["type"] == "namespace")
    web_search = next(t for t in body["tools"] if t["type"] == "web_search")
    send_input = next(t for t in namespace["tools"] if t["name"] == "send_input")  # a boolean: a forced call ends soon
    one = {"function": _small_schema(functions[0], "cmd"), "namespace": {**namespace, "tools": [_small_schema(send_input, "interrupt")]},
           "custom": PATCH, "web_search": web_search, "tool_search": TOOL_SEARCH}
    body["tools"] = [one[k] for k in kinds]
    return body | changes


def _post(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def _check_codex_stream(events: list[dict[str, Any]], cut: bool = False) -> dict[str, Any]:
    """What Codex's SSE parser needs: created first, completed last with an id and a usage it parses,
    every output item added then done, sequence numbers in order. The final response is returned. A
    reply `cut` by max_output_tokens may end `response.incomplete` instead (Codex takes it as an error)."""
    kinds = [e["type"] for e in events]
    ends = ("response.completed", "response.incomplete") if cut else ("response.completed",)
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ends, kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert added == [e["output_index"] for e in done]
    final = events[-1]["response"]
    usage = final["usage"]
    assert isinstance(final["id"], str) and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens_details"]["cached_tokens"] == 0 and usage["output_tokens_details"]["reasoning_tokens"] == 0
    assert all(e["item"]["status"] == "completed" for e in done)
    if kinds[-1] == "response.completed":
        assert [e["item"] for e in done] == final["output"]
    else:
        assert final["incomplete_details"]["reason"] == "max_output_tokens"
    return final


def _done_items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items Codex keeps of a turn: those of its output_item.done events."""
    return [e["item"] for e in events if e["type"] == "response.output_item.done"]


def _ignored(response: dict[str, Any]) -> list[str]:
    return [t["type"] for t in response["ignored_tools"]]


def test_the_codex_request_is_served_whole_and_streamed(http):
    whole = _post(http, codex_body(stream=False, max_output_tokens=8))
    assert whole["status"] in ("completed", "incomplete") and whole["store"] is False
    assert _ignored(whole) == ["web_search", "tool_search"]
    assert {t["name"] for t in whole["tools"]} == {"exec_command", "send_input", "apply_patch"}
    final = _check_codex_stream(_stream(http, codex_body(max_output_tokens=8, stream_options={"include_obfuscation": False})), cut=True)
    assert _ignored(final) == ["web_search", "tool_search"] and final["reasoning"]["summary"] == "auto"
    assert not [i for i in final["output"] if i["type"] == "reasoning"]  # the model does not reason


def test_a_namespaced_call_carries_its_namespace(http):
    body = codex_body(NAMESPACED, stream=False, tool_choice={"type": "function", "name": "send_input"}, max_output_tokens=ROOM)
    (call,) = _post(http, body)["output"]
    assert call["type"] == "function_call" and call["namespace"] == "multi_agent_v1" and call["name"] == "send_input"
    assert call["call_id"].startswith("call_") and isinstance(json.loads(call["arguments"])["interrupt"], bool)
    stored = _post(http, body | {"store": True})
    read = http.get(f"/v1/responses/{stored['id']}").json()  # a read of it maps the call back the same way
    assert read["output"] == stored["output"] and read["output"][0]["namespace"] == "multi_agent_v1"
    assert _ignored(read) == ["web_search", "tool_search"]


def test_a_custom_call_streams_as_codex_reads_it(http):
    events = _stream(http, codex_body(CUSTOM, tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=ROOM))
    _check_codex_stream(events, cut=True)  # the tiny model's freeform string may run to the limit
    (call,) = _done_items(events)
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch" and isinstance(call["input"], str)
    assert "arguments" not in call and call["call_id"].startswith("call_")
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds and kinds.count("response.custom_tool_call_input.done") == 1
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    assert deltas == call["input"]


def test_a_second_stateless_turn_resends_everything(http):
    first = _post(http, codex_body(NAMESPACED, stream=False, tool_choice={"type": "function", "name": "send_input"}, max_output_tokens=ROOM))
    custom = _stream(http, codex_body(CUSTOM, tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=ROOM))
    (call,), (patch,) = first["output"], _done_items(custom)
    history = [
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-not-ours"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}], "content": None},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"},
        patch,
        {"type": "custom_tool_call_output", "call_id": patch["call_id"], "output": "Success. Updated the following files:"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}], "phase": "final_answer"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
    ]
    body = codex_body(NAMESPACED, input=codex_body()["input"] + history, max_output_tokens=8)
    _check_codex_stream(_stream(http, body), cut=True)
    whole = _post(http, body | {"stream": False})
    assert whole["previous_response_id"] is None and _ignored(whole) == ["web_search", "tool_search"]


def test_codex_headers_and_bad_input(http):
    r = http.post("/v1/responses", json=codex_body(tools=[{"type": "computer"}], stream=False))
    assert r.status_code == 400 and "tool type `computer`" in r.json()["error"]["message"]
    r = http.post("/v1/responses", json=codex_body(input=[{"type": "mystery"}], stream=False))
    assert r.status_code == 400 and "mystery" in r.json()["error"]["message"]


_mutation = st.sampled_from([
    ("tools", lambda b: b["tools"] + [{"type": "local_shell"}, {"type": "image_generation", "output_format": "png"}]),
    ("tools", lambda b: [{"type": "namespace", "name": "ns", "tools": b["tools"][1]["tools"] * 2}]),
    ("tools", lambda b: [{"type": "custom", "name": "free"}]),
    ("tools", lambda b: [{"type": "bogus"}]),
    ("input", lambda b: b["input"] + [{"type": "compaction", "encrypted_content": "x"}, {"type": "ghost_snapshot", "ghost_commit": {}}]),
    ("input", lambda b: b["input"] + [{"type": "function_call_output", "call_id": "call_none", "output": "x"}]),
    ("input", lambda b: b["input"] + [{"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "x"}]),
    ("input", lambda b: [{"type": "reasoning", "summary": []}]),
    ("tool_choice", lambda b: {"type": "custom", "name": "exec_command"}),
    ("tool_choice", lambda b: {"type": "function", "name": "missing"}),
    ("reasoning", lambda b: {"effort": "xhigh", "summary": "none"}),
    ("include", lambda b: ["reasoning.encrypted_content", "message.output_text.logprobs"]),
    ("truncation", lambda b: "auto"),
    ("service_tier", lambda b: "flex"),
    ("client_metadata", lambda b: {"x": "y" * 9000}),
])


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_mutation, min_size=1, max_size=3))
def test_variations_of_the_codex_request_never_fail_the_server(http, mutations):
    body = codex_body(stream=False, max_output_tokens=4)
    captured = codex_body(stream=False, max_output_tokens=4)  # each change reads the captured request, not another change's
    for key, change in mutations:
        body[key] = change(captured)
    r = http.post("/v1/responses", json=body)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["message"], r.text
    else:
        assert r.json()["object"] == "response"
