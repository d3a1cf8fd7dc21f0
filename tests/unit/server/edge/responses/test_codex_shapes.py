"""The Responses API's request model against what the Codex CLI (0.169.0) sends: its captured first
request validates as it is; namespace tools are offered flattened and their calls carry the namespace
back; custom tools are offered as a one-string function and their calls come back as
`custom_tool_call` items; built-in tools are accepted, not offered, and reported; every item type
Codex resends turns into the stored conversation (or is dropped); bad input is still a clear error."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from liveloop.server.edge.responses.items import DROPPED, custom_arguments
from liveloop.server.edge.responses.protocol import ResponsesRequest
from liveloop.server.edge.responses.serving import input_items, output_items
from liveloop.server.edge.responses.tools import custom_input

CAPTURED = Path(__file__).resolve().parents[4] / "data" / "agents" / "codex-0.169.0" / "turn1-request.json"
BODY = json.loads(CAPTURED.read_text())["body"]
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}


def _request(**changes) -> ResponsesRequest:
    body = copy.deepcopy(BODY)
    body.update(changes)
    return ResponsesRequest.model_validate_json(json.dumps(body))


def test_the_captured_codex_request_validates():
    req = _request()
    assert req.store is False and req.stream and req.reasoning.summary == "auto"
    assert req.include == ["reasoning.encrypted_content"] and req.client_metadata["session_id"] == req.prompt_cache_key
    roles = [m["role"] for m in req.conversation()]
    assert roles == ["system", "user", "user"]  # two developer messages are one system turn
    system = req.conversation()[0]["content"]
    assert system.startswith("You are a coding agent") and "<skills_instructions>" in system


def test_namespace_tools_are_offered_flattened_and_calls_carry_the_namespace():
    req = _request()
    offered = req.offer()
    names = [t.name for t in offered.tools]
    assert "multi_agent_v1" not in names and {"close_agent", "spawn_agent", "exec_command"} <= set(names)
    assert offered.namespaces["spawn_agent"] == "multi_agent_v1" and "exec_command" not in offered.namespaces
    options = req.options()
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "close_agent", "arguments": '{"target": "a"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'}}]}
    first, second = output_items("resp_x", message, "completed", options)
    assert first == {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "close_agent",
                     "arguments": '{"target": "a"}', "namespace": "multi_agent_v1"}
    assert "namespace" not in second


def test_a_named_choice_may_name_a_flattened_function():
    req = _request(tool_choice={"type": "function", "name": "close_agent"})
    tools, choice, _ = req.tool_setup()
    assert choice.mode == "named" and choice.name == "close_agent" and "close_agent" in [t.name for t in tools]


def test_custom_tools_are_a_one_string_function_and_their_calls_custom_items():
    req = _request(tools=BODY["tools"] + [PATCH, {"type": "custom", "name": "note", "format": {"type": "text"}}],
                   tool_choice={"type": "custom", "name": "apply_patch"})
    offered = req.offer()
    patch = next(t for t in offered.tools if t.name == "apply_patch")
    assert patch.parameters["required"] == ["input"] and "*** Begin Patch" in patch.parameters["properties"]["input"]["description"]
    assert offered.custom == ["apply_patch", "note"] and req.tool_setup()[1].name == "apply_patch"
    message = {"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "apply_patch", "arguments": custom_arguments("*** Begin Patch\n")}}]}
    text, call = output_items("resp_x", message, "completed", req.options())
    assert text["type"] == "message"
    assert call == {"id": "ctc_9", "type": "custom_tool_call", "status": "completed", "call_id": "call_9", "name": "apply_patch",
                    "input": "*** Begin Patch\n"}
    assert custom_input("not json") == "not json" and custom_input('{"other": 1}') == '{"other": 1}'


def test_builtin_tools_are_accepted_not_offered_and_reported():
    builtins = [{"type": "web_search", "external_web_access": False}, {"type": "local_shell"},
                {"type": "image_generation", "output_format": "png"}, {"type": "file_search", "vector_store_ids": ["v"]},
                {"type": "tool_search", "execution": "client", "description": "find tools", "parameters": {"type": "object"}}]
    req = _request(tools=builtins)
    offered = req.offer()
    assert offered.tools == [] and [i["type"] for i in offered.ignored] == [b["type"] for b in builtins]
    assert req.options()["tool_choice"] == "auto" and req.options()["ignored_tools"] == offered.ignored
    assert req.tool_setup()[1].mode == "auto"  # no tools offered: nothing for the model to call
    plain = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    assert not {"ignored_tools", "tool_namespaces", "custom_tools"} & set(plain.options())  # stored options unchanged


def test_every_item_codex_resends_round_trips_into_the_conversation():
    history = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA..."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}], "content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}], "phase": "commentary"},
        {"type": "function_call", "name": "close_agent", "namespace": "multi_agent_v1", "arguments": "{}", "call_id": "call_a"},
        {"type": "custom_tool_call", "status": "completed", "call_id": "call_b", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "function_call_output", "call_id": "call_a", "output": "closed"},
        {"type": "custom_tool_call_output", "call_id": "call_b", "name": "apply_patch",
         "output": [{"type": "input_text", "text": "Done"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
        {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": "q"}},
        {"type": "local_shell_call", "call_id": "ls_1", "status": "completed", "action": {"type": "exec", "command": ["ls"]}},
        {"type": "tool_search_call", "call_id": "ts", "execution": "client", "arguments": {"query": "x"}},
        {"type": "tool_search_output", "call_id": "ts", "status": "completed", "execution": "client", "tools": []},
        {"type": "image_generation_call", "status": "completed", "result": "AA"},
        {"type": "compaction", "encrypted_content": "x"}, {"type": "compaction_summary", "encrypted_content": "x"},
        {"type": "ghost_snapshot", "ghost_commit": {"id": "abc"}},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Next."}],
         "internal_chat_message_metadata_passthrough": {"turn_id": "t"}},
    ]
    req = _request(input=BODY["input"] + history)
    conv = req.conversation()[3:]
    assert conv[0] == {"role": "assistant", "content": "Looking.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "close_agent", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "apply_patch", "arguments": custom_arguments("*** Begin Patch")}}]}
    assert conv[1] == {"role": "tool", "tool_call_id": "call_a", "content": "closed"}
    assert conv[2]["role"] == "tool" and conv[2]["content"].startswith("Done[image omitted")
    assert conv[3] == {"role": "user", "content": "Next."} and len(conv) == 4
    assert {"reasoning", "web_search_call", "compaction", "ghost_snapshot"} <= set(DROPPED)
    shown = input_items(req.conversation(), req.options())
    assert [i["type"] for i in shown][-4:] == ["function_call", "function_call_output", "function_call_output", "message"]


def test_the_other_fields_codex_may_send_are_accepted():
    req = _request(service_tier="priority", text={"verbosity": "low"}, stream_options={"include_obfuscation": False},
                   safety_identifier="u1", max_tool_calls=4, top_logprobs=0, truncation="auto", background=False,
                   reasoning={"effort": "high", "summary": "detailed"}, prompt_cache_retention="24h", instructions="Be brief.")
    assert req.options()["reasoning"] == {"effort": "high", "summary": "detailed"}


@pytest.mark.parametrize("change, says", [
    ({"tools": [{"type": "computer"}]}, "tool type `computer` is not supported"),
    ({"input": [{"type": "mystery_call"}]}, "type `mystery_call` is not supported"),
    ({"include": ["everything"]}, "include"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "x"}]}]}, "tools"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]}, "syntax"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "bogus": 1}]}, "bogus"),
    ({"reasoning": {"effort": "maximal"}}, "effort"),
    ({"client_metadata": {"k": 1}}, "client_metadata"),
])
def test_bad_input_is_still_a_clear_error(change, says):
    with pytest.raises(ValidationError) as err:
        _request(**change)
    assert says in str(err.value)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8))
_json = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=8)
_kinds = st.sampled_from(["message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
                          *DROPPED, "nope"])
_tool_kinds = st.sampled_from(["function", "namespace", "custom", "web_search", "tool_search", "local_shell", "bogus"])


@st.composite
def _shapes(draw):
    items = draw(st.lists(st.fixed_dictionaries({"type": _kinds}, optional={
        "role": st.sampled_from(["user", "assistant", "developer", "system", "tool"]),
        "content": st.one_of(st.text(max_size=5), st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["input_text", "output_text", "input_image"]), "text": st.text(max_size=5)}), max_size=2)),
        "call_id": st.text(max_size=5), "name": st.sampled_from(["f", "g", "bad name"]), "namespace": st.sampled_from(["ns", "x y"]),
        "arguments": st.text(max_size=5), "input": st.text(max_size=5), "output": st.text(max_size=5), "extra": _json,
    }), min_size=1, max_size=5))
    tools = draw(st.lists(st.fixed_dictionaries({"type": _tool_kinds}, optional={
        "name": st.sampled_from(["f", "g", "ns"]), "tools": st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(["function", "custom"]), "name": st.sampled_from(["f", "h"])}), max_size=2),
        "format": st.one_of(st.just({"type": "text"}), st.fixed_dictionaries({"type": st.just("grammar"), "syntax": st.sampled_from(["lark", "regex", "x"]),
                                                                              "definition": st.text(max_size=5)})),
        "parameters": _json,
    }), max_size=4))
    body = {"model": "m", "input": items, "tools": tools}
    for key, value in draw(st.dictionaries(st.sampled_from(["reasoning", "include", "client_metadata", "prompt_cache_key", "service_tier",
                                                            "truncation", "background", "tool_choice", "store", "top_logprobs"]), _json, max_size=3)).items():
        body[key] = value
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes())
def test_any_shape_validates_or_is_refused_cleanly(body):
    """The request model never raises anything but a validation error, and what it accepts turns into a
    conversation, an offer and stored options without raising."""
    try:
        req = ResponsesRequest.model_validate_json(json.dumps(body))
    except ValidationError:
        return
    req.conversation()
    req.tool_setup()
    json.dumps(req.options())
    req.chars()
