"""Tool use and structured output, as every generating endpoint offers them (OpenAI chat, Anthropic
messages, the Responses API): the tools a request offers and how it lets the model use them
(`ToolUse`), the constraint constrained decoding samples under (an xgrammar structural tag,
liveloop.grammar), and the conversation in the one shape the chat template, the store and the exports
read (OpenAI chat messages: `role`, `content`, `tool_calls`, `tool_call_id`).

Which syntax a call has is the model family's (server/edge/formats/tool_parsers/, chosen by
`[engine] tool_call_parser`): the chat template renders the offered tools and earlier calls, the
parser reads calls back out of what the model wrote, and for `required` or a named tool choice the
parser's call syntax with each tool's JSON schema as the arguments' grammar is the constraint, so the
model can only write a call that parses against the schema (a generation cut by max_tokens may still
end inside one). `auto` samples freely and parses; what does not parse stays text. `none` renders the
tools and parses nothing.

Knows nothing about HTTP: bad input raises ToolsRefused (the edge answers 400 in its API's shape)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from liveloop.server.edge.formats.tool_parsers import Parsed, ToolParser, ToolStream

ChoiceMode = Literal["auto", "none", "required", "named"]
MAX_SCHEMA_BYTES = 64 << 10  # one tool's parameters or one response format's schema, as JSON
NO_PARAMETERS = {"type": "object", "properties": {}}  # the arguments of a function that takes none


class ToolsRefused(ValueError):
    """A request the tools or structured-output rules refuse; `param` names the field."""

    def __init__(self, message: str, param: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Tool:
    """One function a request offers: its name, what it does, the JSON schema of its arguments."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))
    strict: bool = False

    @classmethod
    def offered(cls, name: str, description: str | None, parameters: dict[str, Any] | None, strict: bool | None) -> Tool:
        """A tool as a request offers it: no `parameters` is a function of no arguments."""
        return cls(name, description, dict(NO_PARAMETERS) if parameters is None else parameters, bool(strict))

    def openai(self) -> dict[str, Any]:
        """OpenAI's chat shape (`{"type": "function", "function": {...}}`): what templates, the store
        and TRL's tool-calling datasets read."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode = "auto"
    name: str | None = None  # mode "named": the one function the model must call


@dataclass(frozen=True)
class ToolUse:
    """The tools of one request, how the model may use them, and the family syntax their calls have."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool
    parser: ToolParser

    def bounded(self, max_string: int) -> "ToolUse":
        """These tools with their parameters `bounded` for the grammar (what the prompt shows is unchanged)."""
        if not max_string:
            return self
        tools = tuple(dataclasses.replace(t, parameters=bounded(t.parameters, max_string)) for t in self.tools)
        return dataclasses.replace(self, tools=tools)

    def constraint(self, layout: JSONLayout) -> str | None:
        """The structural tag `required` and a named choice sample under: the parser's call syntax
        with each tool's arguments as JSON its schema accepts; None for `auto` and `none`."""
        if self.choice.mode not in ("required", "named"):
            return None
        from xgrammar.structural_tag import StructuralTag, TagsWithSeparatorFormat

        chosen = [t for t in self.tools if self.choice.mode == "required" or t.name == self.choice.name]
        tags = [self.parser.call_format(t.name, json_format(t.parameters, layout)) for t in chosen]
        if self.choice.mode == "named" or not self.parallel:
            fmt = tags[0] if len(tags) == 1 else TagsWithSeparatorFormat(tags=tags, separator=self.parser.separator, at_least_one=True, stop_after_first=True)
        else:
            fmt = TagsWithSeparatorFormat(tags=tags, separator=self.parser.separator, at_least_one=True)
        return StructuralTag(format=fmt).model_dump_json()

    @property
    def parses(self) -> bool:
        """Whether the output is read for calls (every choice but `none`)."""
        return self.choice.mode != "none"

    def parse(self, text: str) -> Parsed:
        if not self.parses:
            return Parsed(text or None, ())
        parsed = self.parser.parse(text)
        if not self.parallel and len(parsed.calls) > 1:
            parsed = Parsed(parsed.content, parsed.calls[:1])
        return parsed

    def stream(self) -> ToolStream | None:
        return self.parser.stream() if self.parses else None

    def definitions(self) -> list[dict[str, Any]]:
        return [t.openai() for t in self.tools]


def openai_choice(choice: Any, has_tools: bool) -> ToolChoice:
    """OpenAI's `tool_choice` (chat's and the Responses API's request models): unset means auto with
    tools, none without; a named choice is `{"type": "function", "function": {"name"}}` in chat and
    `{"type": "function", "name"}` in the Responses API."""
    if choice is None:
        return ToolChoice("auto" if has_tools else "none")
    if isinstance(choice, str):
        return ToolChoice(choice)
    name = choice.function.name if hasattr(choice, "function") else choice.name
    return ToolChoice("named", name)


def after_user(messages: list[dict[str, Any]], tools: list[Tool], choice: ToolChoice) -> ToolChoice:
    """`[server] auto_tool_choice = "required_after_user"`: an `auto` choice with tools offered becomes
    `required` when the reply answers a user's turn (the last message that is not a system or developer
    turn is the user's); a reply to a tool's result, and any other choice, stay as asked."""
    if choice.mode != "auto" or not tools:
        return choice
    last = next((m for m in reversed(messages) if m.get("role") not in ("system", "developer")), None)
    return ToolChoice("required") if last is not None and last.get("role") == "user" else choice


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """`schema` if it is a JSON Schema (a dict that the 2020-12 meta-schema accepts, or whichever
    draft its `$schema` names) of bounded size; raises ToolsRefused otherwise. Whether constrained
    decoding can compile it is checked when the constraint is (`InvalidConstraint`)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise ToolsRefused(f"{param}: a JSON Schema must be an object", param)
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise ToolsRefused(f"{param}: not JSON: {exc}", param) from None
    if size > MAX_SCHEMA_BYTES:
        raise ToolsRefused(f"{param}: at most {MAX_SCHEMA_BYTES} bytes of JSON Schema", param)
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise ToolsRefused(f"{param}: not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message[:200]}", param) from None
    except Exception as exc:  # an unresolvable $ref, a recursion: still the schema's fault
        raise ToolsRefused(f"{param}: not a usable JSON Schema: {str(exc)[:200]}", param) from None
    return schema


@dataclass(frozen=True)
class JSONReply:
    """A response format asking for JSON: one the schema accepts, or (None) any object (JSON mode)."""

    schema: dict[str, Any] | None = None


JSONLayout = Literal["canonical", "compact", "free"]
_SEPARATORS = {"canonical": (", ", ": "), "compact": (",", ":")}
ANY_OBJECT = {"type": "object", "additionalProperties": True}  # JSON mode: any object


_NOT_SCHEMAS = frozenset({"enum", "const", "default", "examples", "required", "description", "title"})
_SAFE_INTEGER = 2**53 - 1  # beyond it no JSON client reads an integer exactly


def bounded(schema: Any, max_string: int) -> Any:
    """`schema` with a bound where it sets none, for a grammar to sample under (`[engine]
    json_max_string`; 0: `schema` as it is): a string with no maxLength, enum, const, pattern or format
    at most `max_string` characters, an integer with no minimum or maximum within +-(2^53 - 1). A small
    model under a grammar otherwise writes one string, or one 40-digit number, until max_tokens."""
    if not max_string or isinstance(schema, bool):
        return schema
    if isinstance(schema, list):
        return [bounded(s, max_string) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _NOT_SCHEMAS else bounded(v, max_string)) for k, v in schema.items()}
    kinds = schema.get("type")
    kinds = {kinds} if isinstance(kinds, str) else {k for k in kinds if isinstance(k, str)} if isinstance(kinds, list) else set()
    if "string" in kinds and not {"maxLength", "enum", "const", "pattern", "format"} & schema.keys():
        out["maxLength"] = max_string
    if "integer" in kinds and not {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const"} & schema.keys():
        out |= {"minimum": -_SAFE_INTEGER, "maximum": _SAFE_INTEGER}
    return out


def json_format(schema: dict[str, Any] | bool, layout: JSONLayout) -> Any:
    """The xgrammar format of JSON text that `schema` accepts, laid out as `layout` says: canonical
    (json.dumps' separators ", " and ": " and no other whitespace), compact, or free (any whitespace
    between tokens)."""
    import xgrammar as xgr
    from xgrammar.structural_tag import GrammarFormat

    text = json.dumps(schema)
    if layout == "free":
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=True)
    else:
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False, separators=_SEPARATORS[layout])
    return GrammarFormat(grammar=str(grammar))


def json_constraint(schema: dict[str, Any] | None, layout: JSONLayout) -> str:
    """The structural tag of a JSON reply: any JSON object (`schema` None: JSON mode) or one the
    schema accepts."""
    from xgrammar.structural_tag import StructuralTag

    return StructuralTag(format=json_format(schema if schema is not None else ANY_OBJECT, layout)).model_dump_json()


def check_tool_results(messages: Sequence[dict[str, Any]]) -> None:
    """Every tool result answers a call an earlier assistant turn made (`tool_call_id`); raises
    ToolsRefused naming the message otherwise."""
    calls: dict[str, str] = {}
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or ():
            calls[call["id"]] = call["function"]["name"]
        if m["role"] == "tool":
            if m.get("tool_call_id") not in calls:
                raise ToolsRefused(
                    f"messages.{i}.tool_call_id: `{m.get('tool_call_id')}` answers no tool call of an earlier assistant message",
                    f"messages.{i}.tool_call_id",
                )
            m.setdefault("name", calls[m["tool_call_id"]])


def template_messages(messages: Sequence[dict[str, Any]], arguments_as_text: bool) -> list[dict[str, Any]]:
    """The conversation as a chat template takes it: calls' arguments as the text the model wrote
    (`arguments_as_text`, a template that writes a string as it is) or parsed into objects (what most
    templates expect; text that is not JSON stays text)."""
    if arguments_as_text:
        return [dict(m) for m in messages]
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [_parsed_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _parsed_call(call: dict[str, Any]) -> dict[str, Any]:
    try:
        arguments = json.loads(call["function"]["arguments"])
    except (ValueError, TypeError):
        return call
    return {**call, "function": {**call["function"], "arguments": arguments}}


def takes_text_arguments(chat_template: str | None) -> bool:
    """Whether a chat template writes a call's arguments as given when they are a string (Qwen's and
    liveloop-tiny's `arguments is string` test): then the text the model sampled goes back exactly."""
    return bool(chat_template) and "arguments is string" in chat_template


def output_message(parsed: Parsed) -> dict[str, Any]:
    """The assistant message of a reply, in the stored (OpenAI chat) shape."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls
        ]
    return message
