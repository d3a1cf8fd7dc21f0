"""Anthropic Messages' request (POST /v1/messages, and POST /v1/messages/count_tokens), as the official
`anthropic` client sends it: a `system` prompt (a string or text blocks), `messages` of user and
assistant turns whose content is a string or blocks (`text`; `tool_use` in assistant turns;
`tool_result` in user turns, its content text or text blocks, with `is_error`), `tools` (custom tools:
`name`, `description`, `input_schema`), `tool_choice` (`auto`, `any`, `tool` with a `name`, `none`;
`disable_parallel_tool_use`), `max_tokens` (required), `stop_sequences`, `temperature` (0-1,
Anthropic's range), `top_p`, `top_k`, `metadata.user_id` (who the canary routes by, as OpenAI's
`user`) and `stream`. `cache_control` is accepted on every block and tool and changes nothing: there is
no prompt cache to steer. Any other block type (images, documents, thinking) and server tools are a 400
naming them. liveloop's extensions, as on the OpenAI endpoints: `seed`, `store` and vLLM's sampling
extensions. The response and its stream events are made by server/edge/messages/serving.py."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.protocol import MAX_MESSAGES, MAX_TOOLS, Count, Name, SamplingExtensions, Seed, Text, _Strict, check_stops
from liveloop.server.edge.formats.tools import Tool, ToolChoice

CacheControl = dict[str, Any] | None  # accepted and ignored: there is no prompt cache to steer


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl = None
    citations: list[Any] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: Annotated[Text, Field(min_length=1, max_length=64)]
    name: Name
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: Annotated[Text, Field(min_length=1, max_length=64)]
    content: Text | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: CacheControl = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content)


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]
_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use"), "system": ("text",)}


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
                    if inner_kind != "text":
                        raise ValueError(f"content block {i}: tool_result content block {j}: type `{inner_kind}` is not supported (only `text`)")
    return v


def _joined(content: str | list | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextBlock))


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant"]
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
        if isinstance(self.content, str):
            return len(self.content)
        n = 0
        for b in self.content:
            n += len(b.text) if isinstance(b, TextBlock) else len(b.text()) if isinstance(b, ToolResultBlock) else len(json.dumps(b.input))
        return n

    def stored(self) -> list[dict[str, Any]]:
        """This turn as stored (OpenAI chat) messages: a user turn's tool results are `tool` messages
        (before its text, as Anthropic orders them), an assistant turn's tool uses are its calls."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        text = self.text()
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


class _Conversation(_Strict):
    """What the messages endpoint and its token count share: the conversation and the tools."""

    model: str
    messages: list[AnthropicMessage]
    system: Text | list[TextBlock] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    chars_param: ClassVar[str] = "messages"

    @model_validator(mode="before")
    @classmethod
    def _system_blocks(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _known_blocks(v.get("system"), "system")
        return v

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[AnthropicMessage]) -> list[AnthropicMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        if len(v) > MAX_MESSAGES:
            raise ValueError(f"at most {MAX_MESSAGES} messages")
        return v

    def system_text(self) -> str:
        return _joined(self.system)

    def chars(self) -> int:
        return len(self.system_text()) + sum(m.chars() for m in self.messages)

    def conversation(self) -> list[dict[str, Any]]:
        system = self.system_text()
        out = [{"role": "system", "content": system}] if system else []
        for m in self.messages:
            out += m.stored()
        return out

    def tool_setup(self) -> tuple[list[Tool], ToolChoice, bool]:
        """The tools offered, the choice (auto, any -> required, tool -> named, none) and whether
        several calls may come in one reply."""
        tools = [Tool.offered(t.name, t.description, t.input_schema, t.strict) for t in self.tools or ()]
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
    seed: Seed | None = Field(default=None, description="extension: the sampling seed")
    store: bool = Field(default=True, description="extension: false serves the request and logs nothing")

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stops(v or [])
        return v

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def user(self) -> str | None:
        return self.metadata.user_id if self.metadata else None
