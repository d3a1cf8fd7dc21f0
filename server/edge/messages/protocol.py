"""Anthropic Messages' request (POST /v1/messages, and POST /v1/messages/count_tokens), as the official
`anthropic` client and Claude Code send it: a `system` prompt (a string or text blocks; Claude Code's
billing-header block dropped, server/edge/messages/normalise.py), `messages` of user, assistant and
system turns (a system turn mid-conversation renders as one there) whose content is a string or blocks
(`text`; `tool_use`, `thinking` and `redacted_thinking` in assistant turns, thinking never shown to the
model; `tool_result` in user turns, its content text, text blocks or `tool_reference`s, with
`is_error`), `tools` (custom tools: `name`, `description`, `input_schema`, `strict`; `defer_loading`
tools are offered once a `tool_reference` names them; `input_examples` and `eager_input_streaming`
accepted and not read), `tool_choice` (`auto`, `any`, `tool` with a `name`, `none`;
`disable_parallel_tool_use`), `max_tokens` (required), `stop_sequences`, `temperature` (0-1), `top_p`,
`top_k`, `metadata.user_id` (who the canary routes by, as OpenAI's `user`; Claude Code's is a JSON
string, used whole), `stream`, `thinking` (adaptive, enabled, disabled: accepted, the served models do
not think), the clearing `context_management` edits, `output_config.effort`/`task_budget`, `service_tier`,
`speed`, `inference_geo` and a top-level `cache_control` (accepted, not applied),
`output_config.format` (a JSON schema the reply is constrained to). `cache_control` is accepted on
every block and tool and changes nothing. Other block types (images, documents, server tool blocks),
server tools, `container` and `mcp_servers` are a 400 naming them. liveloop's extensions, as on the
OpenAI endpoints: `seed`, `store` and vLLM's sampling extensions. The response and its stream events
are made by server/edge/messages/serving.py."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.formats.tools import JSONReply, Tool, ToolChoice
from liveloop.server.edge.messages.normalise import without_billing_header
from liveloop.server.edge.protocol import MAX_MESSAGES, MAX_TOOLS, Count, Name, SamplingExtensions, Seed, Text, _Strict, check_stops

CacheControl = dict[str, Any] | None  # accepted and ignored: there is no prompt cache to steer
ToolId = Annotated[Text, Field(min_length=1, max_length=64)]


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl = None
    citations: list[Any] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: ToolId
    name: Name
    input: dict[str, Any]
    cache_control: CacheControl = None


class ThinkingBlock(_Strict):
    """A resent assistant turn's thinking: accepted, never shown to the model (liveloop's models do not think)."""

    type: Literal["thinking"]
    thinking: Text
    signature: str | None = None
    cache_control: CacheControl = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControl = None


class ToolReferenceBlock(_Strict):
    """In a tool result (Claude Code's ToolSearch): loads the deferred tool it names; renders no text."""

    type: Literal["tool_reference"]
    tool_name: Name
    cache_control: CacheControl = None


ResultPart = Annotated[TextBlock | ToolReferenceBlock, Field(discriminator="type")]


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: ToolId
    content: Text | list[ResultPart] | None = None
    is_error: bool = False
    cache_control: CacheControl = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def references(self) -> list[str]:
        return [b.tool_name for b in self.content or () if isinstance(b, ToolReferenceBlock)]


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]
_BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}
_RESULT_PARTS = ("text", "tool_reference")
# request fields liveloop does not serve, refused by name (rather than ignored: the client would expect them to act)
UNSERVED = {
    "container": "code execution containers are not served",
    "mcp_servers": "MCP servers are not connected to: offer their tools as custom tools",
}


def _known_blocks(v: Any, role: str) -> Any:
    """A 400 naming a block type this endpoint does not serve, before pydantic's union errors."""
    if isinstance(v, list):
        allowed = _BLOCKS[role]
        for i, block in enumerate(v):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in allowed:
                raise ValueError(f"content block {i}: type `{kind}` is not supported in a {role} turn (only {', '.join(f'`{a}`' for a in allowed)})")
            if kind == "tool_result" and isinstance(block.get("content"), list):
                for j, inner in enumerate(block["content"]):
                    inner_kind = inner.get("type") if isinstance(inner, dict) else None
                    if inner_kind not in _RESULT_PARTS:
                        raise ValueError(f"content block {i}: tool_result content block {j}: type `{inner_kind}` is not supported (only `text`, `tool_reference`)")
    return v


def _joined(content: str | list | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextBlock))


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant", "system"]
    content: Text | list[Block]

    @model_validator(mode="before")
    @classmethod
    def _blocks(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("role") in _BLOCKS:
            _known_blocks(v.get("content"), v["role"])
        return v

    def text(self) -> str:
        return _joined(self.content)

    def chars(self) -> int:
        """The characters this turn renders (thinking is not rendered)."""
        if isinstance(self.content, str):
            return len(self.content)
        n = 0
        for b in self.content:
            if isinstance(b, TextBlock):
                n += len(b.text)
            elif isinstance(b, ToolResultBlock):
                n += len(b.text())
            elif isinstance(b, ToolUseBlock):
                n += len(json.dumps(b.input))
        return n

    def references(self) -> list[str]:
        if isinstance(self.content, str):
            return []
        return [name for b in self.content if isinstance(b, ToolResultBlock) for name in b.references()]

    def stored(self) -> list[dict[str, Any]]:
        """This turn as stored (OpenAI chat) messages: a user turn's tool results are `tool` messages
        (before its text, as Anthropic orders them), an assistant turn's tool uses are its calls, its
        thinking is dropped; a system turn is a system message where it stands."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        text = self.text()
        if self.role == "system":
            return [{"role": "system", "content": text}]
        if self.role == "assistant":
            uses = [b for b in self.content if isinstance(b, ToolUseBlock)]
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if uses else "")}
            if uses:
                message["tool_calls"] = [
                    {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
                    for b in uses
                ]
            return [message]
        out: list[dict[str, Any]] = []
        for b in self.content:
            if isinstance(b, ToolResultBlock):
                result: dict[str, Any] = {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
                if b.is_error:
                    result["is_error"] = True
                out.append(result)
        if text or not out:
            out.append({"role": "user", "content": text})
        return out


class AnthropicTool(_Strict):
    name: Name
    description: Annotated[Text, Field(max_length=8192)] | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None
    strict: bool | None = None
    defer_loading: bool = False  # offered only once a tool_reference block names it
    input_examples: Annotated[list[dict[str, Any]], Field(max_length=64)] | None = None  # accepted, not shown
    eager_input_streaming: bool | None = None  # accepted: a call's input always streams as it is written

    @model_validator(mode="before")
    @classmethod
    def _custom(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("type") not in (None, "custom"):
            raise ValueError(f"tool type `{v.get('type')}` is not served (only custom tools with an input_schema)")
        return v


class AnthropicToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: Name | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> "AnthropicToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice `tool` needs a `name` (and only it takes one)")
        return self


class MessagesMetadata(_Strict):
    user_id: Annotated[Text, Field(max_length=256)] | None = None


Display = Literal["summarized", "omitted", "updates"]


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Display | None = None


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: Count
    display: Display | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[ThinkingAdaptive | ThinkingEnabled | ThinkingDisabled, Field(discriminator="type")]


class ContextEdit(_Strict):
    """One of `context_management.edits` that only clears (thinking, old tool uses): accepted, not applied
    (the conversation renders as the client sent it). Server-side compaction (`compact_...`) is a 400."""

    type: Literal["clear_thinking_20251015", "clear_tool_uses_20250919"]
    keep: Any = None
    trigger: Any = None
    clear_at_least: Any = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: Any = None


class ContextManagement(_Strict):
    edits: Annotated[list[ContextEdit], Field(max_length=16)] = []


class OutputFormat(_Strict):
    """Structured output: the reply is JSON the schema accepts (constrained decoding)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class TaskBudget(_Strict):
    type: Literal["tokens"]
    total: Count
    remaining: Annotated[int, Field(ge=0)] | None = None


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted, not applied
    format: OutputFormat | None = None
    task_budget: TaskBudget | None = None  # accepted, not applied


class _Conversation(_Strict):
    """What the messages endpoint and its token count share: the conversation and the tools."""

    model: str
    messages: list[AnthropicMessage]
    system: Text | list[TextBlock] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name of output_config.format
    chars_param: ClassVar[str] = "messages"

    @model_validator(mode="before")
    @classmethod
    def _system_blocks(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for name, why in UNSERVED.items():
                if name in v:
                    raise ValueError(f"`{name}` is not served: {why}")
            _known_blocks(v.get("system"), "system")
        return v

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[AnthropicMessage]) -> list[AnthropicMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        if len(v) > MAX_MESSAGES:
            raise ValueError(f"at most {MAX_MESSAGES} messages")
        if all(m.role == "system" for m in v):
            raise ValueError("messages need a user or assistant turn (system turns alone are no conversation)")
        return v

    @model_validator(mode="after")
    def _one_format(self) -> "_Conversation":
        if self.output_format is not None and self.output_config is not None and self.output_config.format is not None:
            raise ValueError("give the output format once: `output_config.format` or `output_format`")
        return self

    def system_text(self) -> str:
        return _joined(without_billing_header(self.system))

    def chars(self) -> int:
        return len(self.system_text()) + sum(m.chars() for m in self.messages)

    def conversation(self) -> list[dict[str, Any]]:
        system = self.system_text()
        out = [{"role": "system", "content": system}] if system else []
        for m in self.messages:
            out += m.stored()
        return out

    def json_reply(self) -> JSONReply | None:
        fmt = self.output_format or (self.output_config.format if self.output_config else None)
        return JSONReply(fmt.schema_) if fmt is not None else None

    def offered(self) -> list[AnthropicTool]:
        """The tools the model is shown: all but the deferred ones no tool_reference has loaded yet."""
        loaded = {name for m in self.messages for name in m.references()}
        return [t for t in self.tools or () if not t.defer_loading or t.name in loaded]

    def tool_setup(self) -> tuple[list[Tool], ToolChoice, bool]:
        """The tools offered, the choice (auto, any -> required, tool -> named, none) and whether
        several calls may come in one reply."""
        tools = [Tool.offered(t.name, t.description, t.input_schema, t.strict) for t in self.offered()]
        c = self.tool_choice
        if c is None:
            return tools, ToolChoice("auto" if tools else "none"), True
        mode = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}[c.type]
        return tools, ToolChoice(mode, c.name), not c.disable_parallel_tool_use


class CountTokensRequest(_Conversation):
    """POST /v1/messages/count_tokens: the conversation only."""


class MessagesRequest(_Conversation, SamplingExtensions):
    max_tokens: Count
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    metadata: MessagesMetadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None  # accepted: one tier
    speed: Literal["standard", "fast"] | None = None  # accepted: one speed
    inference_geo: Annotated[str, Field(max_length=64)] | None = None  # accepted: served where the server is
    cache_control: CacheControl = None  # accepted: no prompt cache to steer
    seed: Seed | None = Field(default=None, description="extension: the sampling seed")
    store: bool = Field(default=True, description="extension: false serves the request and logs nothing")
    return_token_ids: bool = Field(default=False, description="extension (vLLM's): the prompt's and the reply's token ids")

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stops(v or [])
        return v

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def user(self) -> str | None:
        return self.metadata.user_id if self.metadata else None
