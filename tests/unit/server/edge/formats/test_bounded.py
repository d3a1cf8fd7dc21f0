"""`bounded`: the length bounds `[engine] json_max_string` adds to a schema for its grammar, and what
the grammar then lets a forced call write."""

from __future__ import annotations

import json

import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

from liveloop.server.edge.formats.tools import Tool, ToolChoice, ToolUse, bounded
from liveloop.server.edge.formats.tool_parsers import PARSERS

SAFE = 2**53 - 1


def test_unbounded_strings_and_integers_get_a_bound_nested_too():
    schema = {"type": "object", "properties": {
        "path": {"type": "string"}, "n": {"type": "integer"}, "either": {"type": ["string", "null"]},
        "items": {"type": "array", "items": {"type": "string"}},
        "type": {"type": "string", "enum": ["a", "b"]},  # a property named `type`, and an enum: left as it is
    }, "required": ["path"]}
    out = bounded(schema, 16)
    props = out["properties"]
    assert props["path"] == {"type": "string", "maxLength": 16}
    assert props["n"] == {"type": "integer", "minimum": -SAFE, "maximum": SAFE}
    assert props["either"]["maxLength"] == 16 and props["items"]["items"] == {"type": "string", "maxLength": 16}
    assert props["type"] == {"type": "string", "enum": ["a", "b"]}
    assert out["required"] == ["path"] and schema["properties"]["path"] == {"type": "string"}  # the input is not changed


def test_bounds_the_schema_sets_are_kept_and_zero_changes_nothing():
    for kept in ({"type": "string", "maxLength": 400}, {"type": "string", "pattern": "^a+$"}, {"type": "string", "format": "date"},
                 {"type": "string", "const": "x"}, {"type": "integer", "maximum": 9}, {"type": "integer", "exclusiveMinimum": 0}):
        assert bounded(kept, 16) == kept
    schema = {"type": "string"}
    assert bounded(schema, 0) is schema and bounded(True, 16) is True
    # values that are data, not schemas, are never rewritten
    assert bounded({"type": "object", "default": {"type": "string"}}, 16)["default"] == {"type": "string"}


def test_the_grammar_refuses_a_string_past_the_bound():
    use = ToolUse((Tool.offered("Read", "Read a file.", {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}, None),),
                  ToolChoice("required"), False, PARSERS["hermes"]({"Read"}))
    schema = use.bounded(8).tools[0].parameters
    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
    assert _is_grammar_accept_string(grammar, '{"file_path": "notes.tx"}')
    assert not _is_grammar_accept_string(grammar, '{"file_path": "notes.txt.bak"}')
    assert use.tools[0].parameters["properties"]["file_path"] == {"type": "string"}  # what the prompt shows is unchanged
