"""The Responses API's `tools` and what the model is offered of them (`offer`).

- `function` tools: offered as they are (`defer_loading` is accepted; with no tool_search served, a
  deferred function is offered up front).
- `namespace` tools (Codex's groups): their functions are offered under their own names, flattened;
  a call of one is answered as a `function_call` item carrying the `namespace` back, which Codex
  needs to route it (`ToolName::new(namespace, name)`). A name offered twice is a 400.
- `custom` tools (freeform input; `format` text, or a grammar shown to the model in the description,
  not enforced): offered as a function of one string argument `input`; a call is answered as a
  `custom_tool_call` item whose `input` is that string.
- Built-in tools (`BUILTIN`: web_search, tool_search, local_shell, ...): accepted and not offered;
  the response lists them under `ignored_tools` with the reason.

An unknown tool type is a 400 naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from liveloop.server.edge.protocol import Name, Text, _Strict
from liveloop.server.edge.formats.tools import Tool

BUILTIN = (
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "tool_search",
    "local_shell", "shell", "image_generation", "file_search", "code_interpreter", "computer_use_preview", "mcp",
    "apply_patch",
)
_Description = Annotated[Text, Field(max_length=16384)]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: _Description | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class NamespaceTool(_Strict):
    type: Literal["namespace"]
    name: Name
    description: _Description | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)]


class CustomFormat(_Strict):
    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: Annotated[Text, Field(max_length=65536)] | None = None


class CustomTool(_Strict):
    type: Literal["custom"]
    name: Name
    description: _Description | None = None
    format: CustomFormat | None = None
    defer_loading: bool | None = None


class BuiltinTool(_Strict):
    """A hosted tool this server does not run: its settings are not read."""

    model_config = ConfigDict(extra="allow")
    type: Literal[tuple(BUILTIN)]  # type: ignore[valid-type]


AnyTool = Annotated[FunctionTool | NamespaceTool | CustomTool | BuiltinTool, Field(discriminator="type")]
KINDS = ("function", "namespace", "custom") + BUILTIN


def known_tools(v: Any) -> Any:
    """An unknown tool type is a 400 naming it (before pydantic's generic union error)."""
    if isinstance(v, list):
        for i, tool in enumerate(v):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in KINDS:
                raise ValueError(f"tool {i}: tool type `{kind}` is not supported (served: function, namespace, custom; "
                                 f"accepted and not offered: {', '.join(BUILTIN)})")
    return v


@dataclass
class Offer:
    """What the model is offered, and what maps its calls back to Responses items."""

    tools: list[Tool] = field(default_factory=list)
    namespaces: dict[str, str] = field(default_factory=dict)  # function name -> its namespace
    custom: list[str] = field(default_factory=list)  # names of custom (freeform) tools
    ignored: list[dict[str, str]] = field(default_factory=list)  # {"type", "reason"}

    def maps(self) -> dict[str, Any]:
        """What the stored options keep of it (only what is there): a read of the response maps the
        calls back with it and says which tools were ignored."""
        kept = {"tool_namespaces": self.namespaces, "custom_tools": self.custom, "ignored_tools": self.ignored}
        return {k: v for k, v in kept.items() if v}


def custom_parameters(fmt: CustomFormat | None) -> dict[str, Any]:
    what = "freeform input"
    if fmt is not None and fmt.type == "grammar":
        what += f" in this {fmt.syntax or ''} grammar:\n{fmt.definition or ''}"
    return {"type": "object", "properties": {"input": {"type": "string", "description": what}},
            "required": ["input"], "additionalProperties": False}


def offer(tools: list[Any]) -> Offer:
    out = Offer()
    for t in tools:
        if isinstance(t, FunctionTool):
            out.tools.append(Tool.offered(t.name, t.description, t.parameters, t.strict))
        elif isinstance(t, NamespaceTool):
            for f in t.tools:
                out.tools.append(Tool.offered(f.name, f.description, f.parameters, f.strict))
                out.namespaces[f.name] = t.name
        elif isinstance(t, CustomTool):
            out.tools.append(Tool.offered(t.name, t.description, custom_parameters(t.format), None))
            out.custom.append(t.name)
        else:
            out.ignored.append({"type": t.type, "reason": "a built-in tool this server does not run; not offered to the model"})
    return out


def custom_input(arguments: str) -> str:
    """The freeform input of a custom tool's call: the `input` the model wrote as the function's
    argument, or (arguments that are not that) the arguments text as it is."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, TypeError):
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return parsed["input"]
    return arguments


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str, options: dict[str, Any]) -> dict[str, Any]:
    """A call as the Responses output item its tool's kind says: `custom_tool_call` (with `input`) or
    `function_call` (with the `namespace` a namespaced function came from)."""
    if name in (options.get("custom_tools") or ()):
        return {"id": "ctc_" + item_id.removeprefix("fc_"), "type": "custom_tool_call", "status": status, "call_id": call_id,
                "name": name, "input": custom_input(arguments)}
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}
    namespace = (options.get("tool_namespaces") or {}).get(name)
    if namespace is not None:
        item["namespace"] = namespace
    return item
