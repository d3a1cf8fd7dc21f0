"""server/edge/formats/tools.py: what a request's tools and response format turn into. Hypothesis draws random
schemas with a value each accepts and random tool names: the constraint of a forced call accepts that
value written as the family writes it (canonical JSON) and the parser reads it back; JSON mode and
schemas accept canonical JSON and refuse other layouts; bad schemas and orphan tool results are refused
naming their field."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liveloop.server.edge.formats.tool_parsers import PARSERS
from liveloop.server.edge.formats.tools import Tool, ToolChoice, ToolsRefused, ToolUse, check_schema, check_tool_results, json_constraint, json_format


def _accepts(constraint: str, text: str) -> bool:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    return _is_grammar_accept_string(xgr.Grammar.from_structural_tag(constraint), text)


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,20}", fullmatch=True)
words = st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=8)


@st.composite
def schema_and_value(draw, depth: int = 2):
    """A JSON schema and one value it accepts."""
    kinds = ["string", "integer", "boolean", "enum", "number"] + (["object", "array"] if depth > 0 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "string":
        return {"type": "string"}, draw(words)
    if kind == "integer":
        lo = draw(st.integers(-1000, 1000))
        return {"type": "integer", "minimum": lo, "maximum": lo + 50}, draw(st.integers(lo, lo + 50))
    if kind == "number":
        return {"type": "number"}, draw(st.integers(-10**6, 10**6)) / 8
    if kind == "boolean":
        return {"type": "boolean"}, draw(st.booleans())
    if kind == "enum":
        options = draw(st.lists(words, min_size=1, max_size=4, unique=True))
        return {"enum": options}, draw(st.sampled_from(options))
    if kind == "array":
        item, _ = draw(schema_and_value(depth - 1))
        values = draw(st.lists(schema_and_value(depth - 1).filter(lambda sv: sv[0] == item).map(lambda sv: sv[1]), max_size=3))
        return {"type": "array", "items": item}, values
    keys = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    props, value = {}, {}
    for k in keys:
        props[k], value[k] = draw(schema_and_value(depth - 1))
    return {"type": "object", "properties": props, "required": keys, "additionalProperties": False}, value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(family=st.sampled_from(sorted(PARSERS)), tools=st.lists(st.tuples(names, schema_and_value()), min_size=1, max_size=3, unique_by=lambda t: t[0]),
       pick=st.integers(0, 2))
def test_a_forced_call_accepts_the_canonical_call_and_parses_back(family, tools, pick):
    name, (schema, value) = tools[pick % len(tools)]
    check_schema(schema, "tools.0.parameters")
    parser = PARSERS[family]([n for n, _ in tools])
    offered = tuple(Tool(n, None, s) for n, (s, _) in tools)
    written = parser.call_format(name, json_format(schema, "canonical"))
    text = written.begin + json.dumps(value) + written.end
    for choice in (ToolChoice("required"), ToolChoice("named", name)):
        constraint = ToolUse(offered, choice, True, parser).constraint("canonical")
        assert _accepts(constraint, text)
        parsed = ToolUse(offered, choice, True, parser).parse(text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(name, value)]
        assert parsed.content is None
    compact = written.begin + json.dumps(value, separators=(",", ":")) + written.end
    if compact != text:  # canonical layout only: a sent-back call renders as it was sampled
        assert not _accepts(ToolUse(offered, ToolChoice("named", name), True, parser).constraint("canonical"), compact)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(sv=schema_and_value())
def test_json_formats_accept_what_the_schema_accepts(sv):
    schema, value = sv
    assert _accepts(json_constraint(schema, "canonical"), json.dumps(value))
    if isinstance(value, dict):
        assert _accepts(json_constraint(None, "canonical"), json.dumps(value))  # JSON mode: any object
        assert _accepts(json_constraint(None, "free"), json.dumps(value, indent=2))
        assert not _accepts(json_constraint(None, "canonical"), json.dumps([value]))


def test_parallel_calls_and_single_calls():
    parser = PARSERS["hermes"](["f"])
    tools = (Tool("f", None, {"type": "object", "properties": {}}),)
    one = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert _accepts(ToolUse(tools, ToolChoice("required"), True, parser).constraint("canonical"), one + "\n" + one)
    assert not _accepts(ToolUse(tools, ToolChoice("required"), False, parser).constraint("canonical"), one + "\n" + one)
    assert not _accepts(ToolUse(tools, ToolChoice("required"), True, parser).constraint("canonical"), "")  # at least one
    assert ToolUse(tools, ToolChoice("auto"), True, parser).constraint("canonical") is None
    assert len(ToolUse(tools, ToolChoice("auto"), False, parser).parse(one + "\n" + one).calls) == 1
    assert ToolUse(tools, ToolChoice("none"), True, parser).parse(one).calls == ()


@pytest.mark.parametrize("schema, where", [
    ({"type": "objekt"}, "type"),
    ({"type": "object", "properties": {"a": {"minimum": "zero"}}}, "properties/a/minimum"),
    ([1, 2], None),
])
def test_a_schema_that_is_not_json_schema_is_refused_naming_its_field(schema, where):
    with pytest.raises(ToolsRefused) as refused:
        check_schema(schema, "tools.3.parameters")
    assert refused.value.param == "tools.3.parameters"
    if where:
        assert where in str(refused.value)


def test_a_tool_result_must_answer_an_earlier_call():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "1"}]
    check_tool_results(messages)
    assert messages[2]["name"] == "f"  # the template may want the function's name
    with pytest.raises(ToolsRefused) as refused:
        check_tool_results(messages + [{"role": "tool", "tool_call_id": "call_2", "content": "2"}])
    assert refused.value.param == "messages.3.tool_call_id"
