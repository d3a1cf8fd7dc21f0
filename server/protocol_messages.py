"""Anthropic Messages' request (POST /v1/messages), as the official `anthropic` client sends it: a
`system` prompt (a string or text blocks), `messages` of user and assistant turns whose content is a
string or text blocks (any other block type is a 400 naming it: tools, images and documents are not
served), `max_tokens` (required), `stop_sequences`, `temperature` (0-1, Anthropic's range), `top_p`,
`metadata.user_id` (who the canary routes by, as OpenAI's `user`) and `stream`. liveloop's
extensions, as on the OpenAI endpoints: `seed` and `store`. The response and its stream events are
made by server/serving_messages.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from liveloop.server.protocol_base import MAX_MESSAGES, Count, Seed, Text, _Strict, check_stops

Blocks = str | list["TextBlock"]


class TextBlock(_Strict):
    type: Literal["text"]
    text: Text
    cache_control: dict[str, Any] | None = None  # accepted and ignored: there is no prompt cache to steer


def _text_blocks_only(v: Any) -> Any:
    if isinstance(v, list):
        for i, block in enumerate(v):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind != "text":
                raise ValueError(f"content block {i}: type `{kind}` is not supported (only `text` blocks are)")
    return v


def _joined(content: Blocks | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content)


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant"]
    content: Blocks

    _blocks = field_validator("content", mode="before")(lambda cls, v: _text_blocks_only(v))

    def text(self) -> str:
        return _joined(self.content)


class MessagesMetadata(_Strict):
    user_id: Annotated[Text, Field(max_length=256)] | None = None


class MessagesRequest(_Strict):
    model: str
    max_tokens: Count
    messages: list[AnthropicMessage]
    system: Blocks | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    metadata: MessagesMetadata | None = None
    stream: bool = False
    seed: Seed | None = Field(default=None, description="extension: the sampling seed")
    store: bool = Field(default=True, description="extension: false serves the request and logs nothing")

    _system_blocks = field_validator("system", mode="before")(lambda cls, v: _text_blocks_only(v))

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[AnthropicMessage]) -> list[AnthropicMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        if len(v) > MAX_MESSAGES:
            raise ValueError(f"at most {MAX_MESSAGES} messages")
        return v

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        check_stops(v or [])
        return v

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def system_text(self) -> str:
        return _joined(self.system)

    def user(self) -> str | None:
        return self.metadata.user_id if self.metadata else None
