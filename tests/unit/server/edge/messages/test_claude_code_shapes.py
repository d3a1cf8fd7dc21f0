"""Claude Code's requests on the Messages endpoint (server/edge/messages/): its captured bodies
(tests/data/agents/claude-code-2.1.328/) validate; a system turn mid-conversation renders as a system
turn there through the real chat templates of liveloop-tiny and SmolLM2 (and is folded into user text
for a template that refuses it); the billing-header block is dropped, so two turns render one prefix;
thinking blocks are accepted and never shown; deferred tools wait for a tool_reference; what is not
served is a 400 in Anthropic's shape, never a 500."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import ValidationError

from liveloop.server.edge.body import parse_body
from liveloop.server.edge.errors import install_handlers
from liveloop.server.edge.formats.tools import ToolsRefused
from liveloop.server.edge.messages.normalise import fold_system_turns, is_billing_header, without_billing_header
from liveloop.server.edge.messages.protocol import CountTokensRequest, MessagesRequest, TextBlock
from liveloop.server.edge.messages.serving import render_folding
from liveloop.server.edge.pipeline.prompting import Prompter

ROOT = Path(__file__).resolve().parents[5]
CAPTURED = ROOT / "tests/data/agents/claude-code-2.1.328"
BILLING = "x-anthropic-billing-header: cc_version=2.1.328.ccf; cc_entrypoint=sdk-cli;"


def captured(name: str) -> dict:
    return json.loads((CAPTURED / name).read_text())


def _body(**over) -> dict:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **over}


def _prompter(model: str) -> Prompter:
    from transformers import AutoTokenizer

    path = ROOT / "models" / model
    return Prompter(AutoTokenizer.from_pretrained(str(path)), path, "auto", "canonical", None)


@pytest.fixture(scope="module", params=["liveloop-tiny", "smollm2-135m-instruct"])
def prompter(request) -> Prompter:
    return _prompter(request.param)


def _render(prompter: Prompter, req) -> str:
    tools, choice, parallel = req.tool_setup()
    use = prompter.tool_use(tools, choice, parallel)
    return render_folding(req.conversation(), lambda m: prompter.render(m, use).text)


# -- the captured requests -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["main-request.json", "main-request-all-tools.json"])
def test_the_captured_bodies_validate(name):
    capture = captured(name)
    assert capture["method"] == "POST" and capture["path"] == "/v1/messages?beta=true"
    req = MessagesRequest.model_validate_json(json.dumps(capture["body"]))
    assert req.stream and req.thinking.type == "adaptive" and req.output_config.effort == "high"
    assert json.loads(req.user())["session_id"] == capture["headers"]["X-Claude-Code-Session-Id"]  # the canary key, whole
    conversation = req.conversation()
    assert [m["role"] for m in conversation] == ["system", "user", "system"]
    assert "billing-header" not in conversation[0]["content"]
    assert conversation[0]["content"].startswith("You are a Claude agent")
    assert "DeferredToolPlaceholder" not in [t.name for t in req.offered()]
    assert len(req.offered()) == len(req.tools) - sum(t.defer_loading for t in req.tools)
    count = CountTokensRequest.model_validate({k: v for k, v in capture["body"].items() if k not in ("max_tokens", "metadata", "stream")})
    assert count.conversation() == conversation


# -- the billing header ----------------------------------------------------------------------------
def test_billing_header_is_metadata_and_dropped():
    assert is_billing_header(BILLING) and is_billing_header(" " + BILLING + "\n")
    assert not is_billing_header("You are a Claude agent.") and not is_billing_header(BILLING + "\nmore instructions")
    blocks = [TextBlock(type="text", text=BILLING), TextBlock(type="text", text="Be brief.")]
    assert [b.text for b in without_billing_header(blocks)] == ["Be brief."]
    assert without_billing_header(BILLING + "\nBe brief.") == "Be brief."
    assert without_billing_header("Be brief.") == "Be brief." and without_billing_header(None) is None


def test_two_turns_of_a_session_render_one_prefix(prompter):
    def turn(version: str, messages: list[dict]):
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli;"},
                  {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}]
        return MessagesRequest.model_validate(_body(system=system, messages=messages))

    first = [{"role": "user", "content": "List the files."}]
    second = [*first, {"role": "assistant", "content": "a.txt"}, {"role": "user", "content": "And now?"}]
    one, two = _render(prompter, turn("2.1.328.ccf", first)), _render(prompter, turn("2.1.328.e01", second))
    assert "billing" not in one and two.startswith(one)  # the first turn's prompt begins the second's
    assert _render(prompter, turn("a", first)) == _render(prompter, turn("b", first))


# -- system turns mid-conversation -----------------------------------------------------------------
def test_a_system_turn_mid_conversation_renders_there(prompter):
    req = MessagesRequest.model_validate(_body(system="Top.", messages=[
        {"role": "user", "content": "List the files."},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /tmp", "cache_control": {"type": "ephemeral"}}]},
    ]))
    assert req.conversation()[1:] == [{"role": "user", "content": "List the files."}, {"role": "system", "content": "# Environment\ncwd: /tmp"}]
    text = _render(prompter, req)
    flat = prompter.render([{"role": "system", "content": "Top."}, {"role": "user", "content": "List the files."},
                            {"role": "system", "content": "# Environment\ncwd: /tmp"}], None).text
    assert text == flat and text.index("Top.") < text.index("List the files.") < text.index("# Environment")


def test_fold_system_turns_into_the_user_text_next_to_them():
    sys, user = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"})
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "r"}
    assert fold_system_turns([sys, user, {"role": "system", "content": "M"}]) == [sys, {"role": "user", "content": "U\n\nM"}]
    assert fold_system_turns([user, call, {"role": "system", "content": "M"}, user]) == [user, call, {"role": "user", "content": "M\n\nU"}]
    assert fold_system_turns([user, call, result, {"role": "system", "content": "M"}]) == [user, call, result, {"role": "user", "content": "M"}]
    assert fold_system_turns([sys, user]) == [sys, user]


def test_a_template_that_refuses_a_mid_conversation_system_turn_gets_it_folded():
    from transformers import AutoTokenizer

    path = ROOT / "models" / "liveloop-tiny"
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.chat_template = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('system first only') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    prompter = Prompter(tok, path, "none", "canonical", None)
    req = MessagesRequest.model_validate(_body(messages=[{"role": "user", "content": "Hi."}, {"role": "system", "content": "Env."}]))
    assert _render(prompter, req) == "[user]Hi.\n\nEnv.[assistant]"
    with pytest.raises(ToolsRefused):  # a refusal that folding does not mend stays the request's 400
        render_folding([{"role": "user", "content": "x"}], lambda m: prompter.render([{"role": "system", "content": "a"}, *m, {"role": "system", "content": "b"}], None))


# -- thinking --------------------------------------------------------------------------------------
def test_thinking_blocks_are_accepted_and_never_shown(prompter):
    use = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.txt"}]}]}
    tools = [{"name": "Bash", "description": "Run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    thought = [{"type": "thinking", "thinking": "SECRET-THOUGHT", "signature": "sig"}, {"type": "redacted_thinking", "data": "opaque"},
               {"type": "text", "text": "Listing."}, use]
    plain = [{"type": "text", "text": "Listing."}, use]
    ask = [{"role": "user", "content": "List."}]
    for thinking in ({"type": "adaptive", "display": "omitted"}, {"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        with_thought = MessagesRequest.model_validate(_body(tools=tools, thinking=thinking, messages=[*ask, {"role": "assistant", "content": thought}, result]))
        without = MessagesRequest.model_validate(_body(tools=tools, messages=[*ask, {"role": "assistant", "content": plain}, result]))
        assert with_thought.conversation() == without.conversation()
        assert with_thought.chars() == without.chars()
        text = _render(prompter, with_thought)
        assert "SECRET-THOUGHT" not in text and "opaque" not in text and text == _render(prompter, without)


# -- the other new fields --------------------------------------------------------------------------
def test_deferred_tools_wait_for_a_tool_reference():
    tools = [{"name": "Search", "input_schema": {"type": "object"}},
             {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": True, "input_examples": [{"q": 1}],
              "eager_input_streaming": True, "strict": True, "cache_control": {"type": "ephemeral"}}]
    before = MessagesRequest.model_validate(_body(tools=tools))
    assert [t.name for t in before.offered()] == ["Search"]
    after = MessagesRequest.model_validate(_body(tools=tools, messages=[
        {"role": "user", "content": "find"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Search", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "Later"}]}]},
    ]))
    assert [t.name for t in after.offered()] == ["Search", "Later"]
    assert after.conversation()[-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": ""}


def test_accepted_fields():
    req = MessagesRequest.model_validate(_body(
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"},
                                      {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000}}]},
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}},
                       "task_budget": {"type": "tokens", "total": 1000}},
        thinking={"type": "adaptive", "display": "updates"},
        service_tier="auto", speed="fast", inference_geo="us", cache_control={"type": "ephemeral"}, metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        tool_choice={"type": "auto", "disable_parallel_tool_use": True}, top_k=5,
    ))
    assert req.json_reply().schema == {"type": "object"}
    assert MessagesRequest.model_validate(_body(output_format={"type": "json_schema", "schema": {"type": "array"}})).json_reply().schema == {"type": "array"}
    assert MessagesRequest.model_validate(_body()).json_reply() is None


BAD = [
    ({"container": "c1"}, "container"),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking"),
    ({"thinking": {"type": "adaptive", "depth": 3}}, "depth"),
    ({"output_config": {"effort": "extreme"}}, "effort"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}, "output_format": {"type": "json_schema", "schema": {}}}, "once"),
    ({"context_management": {"edits": [{"type": "clear_everything"}]}}, "type"),
    ({"context_management": {"edits": [{"type": "compact_20260112"}]}}, "clear_tool_uses_20250919"),
    ({"speed": "ludicrous"}, "speed"),
    ({"service_tier": "priority"}, "service_tier"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}, "thinking"),
    ({"messages": [{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}, "tool_result"),
    ({"messages": [{"role": "developer", "content": "x"}]}, "role"),
    ({"messages": [{"role": "system", "content": "x"}]}, "user or assistant turn"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}]}, "image"),
    ({"tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "web_search_20250305"),
    ({"tools": [{"name": "t", "input_schema": {}, "defer_loading": "yes"}]}, "defer_loading"),
    ({"surprise": 1}, "surprise"),
]


@pytest.mark.parametrize(("over", "named"), BAD)
def test_what_is_not_served_is_named(over, named):
    with pytest.raises(ValidationError, match=named):
        MessagesRequest.model_validate(_body(**over))


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    install_handlers(app)

    @app.post("/v1/messages")
    async def _messages(request: Request):
        await parse_body(request, MessagesRequest)
        return {}

    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(("over", "named"), BAD)
def test_not_served_is_an_anthropic_400(client, over, named):
    got = client.post("/v1/messages?beta=true", json=_body(**over), headers={"anthropic-beta": "no-such-beta-2099-01-01"})
    assert got.status_code == 400, got.text
    body = got.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error" and named in body["error"]["message"]


def test_the_captured_request_passes_the_route_with_its_headers(client):
    capture = captured("main-request.json")
    headers = {k: v for k, v in capture["headers"].items() if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
    assert client.post(capture["path"], content=json.dumps(capture["body"]), headers=headers).status_code == 200
    body = copy.deepcopy(capture["body"])
    body["messages"][0]["content"].append({"type": "document", "source": {}})
    assert client.post(capture["path"], json=body).status_code == 400
