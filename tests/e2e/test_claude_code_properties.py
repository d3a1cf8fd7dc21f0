"""Property-based test (hypothesis) of the request shapes Claude Code sends on the Messages endpoint,
against the session's real server (`vllm_server`): system turns anywhere, thinking configs and blocks,
context management, output config, the billing-header block, tool results with text, blocks and tool
references, deferred tools and their other fields, every tool_choice, metadata.user_id as a JSON
string; valid and not (wrong types, unknown values, unserved fields). On every request: never a 5xx
(but a 503 with Retry-After), a 4xx is Anthropic's error body with a message, a whole 200 is a message
whose `usage.input_tokens` count_tokens gives for the same body, a streamed 200 ends with
`message_stop` (or an `error` event)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from .conftest import USER_KEY

MODEL = "liveloop-tiny"
SETTINGS = settings(deadline=None, database=None, max_examples=60, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
HEADERS = {"x-api-key": USER_KEY, "anthropic-version": "2023-06-01",
           "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,no-such-beta-2099-01-01"}
IDS = ("toolu_01", "toolu_02")
TOOL_NAMES = ("Bash", "Read", "Later")
JUNK = st.one_of(st.none(), st.integers(-2, 2**40), st.floats(allow_nan=False), st.text(max_size=8), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))

text = st.text(max_size=24)
cache = st.sampled_from([{}, {"cache_control": {"type": "ephemeral"}}])
text_block = st.builds(lambda t, c: {"type": "text", "text": t, **c}, text, cache)
billing = st.builds(lambda v: {"type": "text", "text": f"x-anthropic-billing-header: cc_version={v}; cc_entrypoint=sdk-cli;"}, st.text("0123456789.abcdef", max_size=12))
system = st.one_of(st.none(), text, st.lists(st.one_of(text_block, billing), max_size=3))
reference = st.builds(lambda n: {"type": "tool_reference", "tool_name": n}, st.sampled_from(TOOL_NAMES))
result_content = st.one_of(st.none(), text, st.lists(st.one_of(text_block, reference), max_size=3))
tool_result = st.builds(lambda i, c, e: {"type": "tool_result", "tool_use_id": i, **({} if c is None else {"content": c}), **e},
                        st.sampled_from(IDS), result_content, st.sampled_from([{}, {"is_error": True}, {"is_error": False}]))
tool_use = st.builds(lambda i, n, a: {"type": "tool_use", "id": i, "name": n, "input": {"command": a}}, st.sampled_from(IDS), st.sampled_from(TOOL_NAMES), text)
thinking_block = st.one_of(st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "sig"}, text),
                           st.builds(lambda d: {"type": "redacted_thinking", "data": d}, text))
odd_block = st.sampled_from([{"type": "image", "source": {}}, {"type": "document"}, {"type": "server_tool_use"}, {"type": "thinking"}, {}, "text"])
CONTENT = {"user": st.one_of(text_block, tool_result), "assistant": st.one_of(text_block, tool_use, thinking_block), "system": text_block}


@st.composite
def message(draw, odd: bool):
    role = draw(st.sampled_from(["user", "user", "assistant", "system"] + (["developer"] if odd else [])))
    if draw(st.booleans()):
        return {"role": role, "content": draw(text)}
    blocks = st.one_of(CONTENT.get(role, text_block), odd_block) if odd else CONTENT[role]
    return {"role": role, "content": draw(st.lists(blocks, max_size=4))}


@st.composite
def turns(draw, odd: bool):
    """Messages, some of them a tool use and the result that answers it (resent as Claude Code sends them)."""
    out: list[dict] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 2)) == 0:
            use = draw(tool_use)
            head = draw(st.lists(st.one_of(thinking_block, text_block), max_size=2))
            out += [{"role": "assistant", "content": [*head, use]},
                    {"role": "user", "content": [{**draw(tool_result), "tool_use_id": use["id"]}, *draw(st.lists(text_block, max_size=1))]}]
        else:
            out.append(draw(message(odd)))
    return out


tool = st.builds(
    lambda n, extra: {"name": n, "description": "Does " + n, "input_schema": {"type": "object", "properties": {"command": {"type": "string", "maxLength": 8}}}, **extra},
    st.sampled_from(TOOL_NAMES),
    st.fixed_dictionaries({}, optional={"defer_loading": st.booleans(), "input_examples": st.just([{"command": "ls"}]), "strict": st.booleans(),
                                        "eager_input_streaming": st.booleans(), "cache_control": st.just({"type": "ephemeral"}), "type": st.just("custom")}),
)
tools = st.lists(tool, max_size=3, unique_by=lambda t: t["name"])
tool_choice = st.one_of(st.builds(lambda t, d: {"type": t, **d}, st.sampled_from(["auto", "any", "none"]), st.sampled_from([{}, {"disable_parallel_tool_use": True}])),
                        st.builds(lambda n: {"type": "tool", "name": n}, st.sampled_from(TOOL_NAMES)))
thinking = st.one_of(st.just({"type": "adaptive", "display": "omitted"}), st.just({"type": "adaptive"}), st.just({"type": "disabled"}),
                     st.builds(lambda b: {"type": "enabled", "budget_tokens": b}, st.integers(1024, 40000)))
context = st.sampled_from([{"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                           {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100}}]}])
output_config = st.one_of(st.builds(lambda e: {"effort": e}, st.sampled_from(["low", "medium", "high", "xhigh", "max"])),
                          st.just({"format": {"type": "json_schema", "schema": {"type": "object"}}}))
user_id = st.builds(lambda d, s: json.dumps({"device_id": d, "account_uuid": "", "session_id": s}), st.text("0123456789abcdef", max_size=64), st.uuids().map(str))
OPTIONAL = {
    "system": system, "tools": tools, "tool_choice": tool_choice, "thinking": thinking, "context_management": context,
    "output_config": output_config, "metadata": st.builds(lambda u: {"user_id": u}, user_id),
    "service_tier": st.sampled_from(["auto", "standard_only"]), "temperature": st.just(0),
}
# what a body may get wrong: one of these, over a body of the shapes above
BAD = st.sampled_from([
    ("thinking", {"type": "enabled"}), ("thinking", {"type": "sometimes"}), ("thinking", {"type": "enabled", "budget_tokens": -1}),
    ("context_management", {"edits": [{"type": "compact_20260112"}]}), ("output_config", {"effort": "extreme"}),
    ("service_tier", "priority"), ("container", "c1"), ("mcp_servers", [{"type": "url", "url": "http://x", "name": "x"}]),
    ("tools", [{"name": "web", "type": "web_search_20250305"}]), ("metadata", {"user_id": "x" * 300}),
])
good = st.fixed_dictionaries({"model": st.just(MODEL), "max_tokens": st.sampled_from([1, 3, 32000]), "messages": turns(False), "stream": st.booleans()},
                             optional=OPTIONAL)
odd = st.fixed_dictionaries({"model": st.just(MODEL), "max_tokens": st.sampled_from([1, 3]), "messages": turns(True), "stream": st.one_of(st.booleans(), JUNK)},
                            optional={**OPTIONAL, **{k: st.one_of(v, JUNK) for k, v in OPTIONAL.items()}})
body = st.one_of(good, good, st.builds(lambda b, bad: {**b, bad[0]: bad[1]}, good, BAD), odd)


@pytest.fixture(scope="module")
def base_url(vllm_server):
    return vllm_server.base_url


def _error_shape(r: httpx.Response) -> None:
    assert r.status_code < 500 or (r.status_code == 503 and "retry-after" in r.headers), (r.status_code, r.text)
    if r.status_code >= 400:
        e = r.json()
        assert e["type"] == "error" and e["error"]["type"] and e["error"]["message"], r.text


def _count(base_url: str, b: dict) -> httpx.Response:
    counted = {k: v for k, v in b.items() if k not in ("max_tokens", "metadata", "stream", "service_tier", "temperature")}
    return httpx.post(base_url + "/v1/messages/count_tokens?beta=true", json=counted, headers=HEADERS, timeout=120)


@SETTINGS
@given(b=body)
def test_no_claude_code_shape_is_a_500(base_url, b):
    counted = _count(base_url, b)
    _error_shape(counted)
    event(f"count_tokens {counted.status_code}")
    if b.get("stream"):
        with httpx.stream("POST", base_url + "/v1/messages?beta=true", json=b, headers=HEADERS, timeout=120) as r:
            event(f"messages streamed {r.status_code}")
            if r.status_code != 200:
                r.read()
                _error_shape(r)
                return
            names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
        assert names[0] == "message_start" and names[-1] in ("message_stop", "error"), names
        return
    r = httpx.post(base_url + "/v1/messages?beta=true", json=b, headers=HEADERS, timeout=120)
    _error_shape(r)
    event(f"messages {r.status_code}")
    if r.status_code == 200:
        m = r.json()
        assert m["type"] == "message" and {c["type"] for c in m["content"]} <= {"text", "tool_use"}
        if counted.status_code == 200:
            assert counted.json()["input_tokens"] == m["usage"]["input_tokens"]
