"""The Responses API's request (POST /v1/responses), as the official `openai` client, the Agents SDK
and the Codex CLI send it: `input` (a string, or items: server/edge/responses/items.py), `instructions`
(a system turn for this request only), `tools` (function, namespace and custom tools offered, built-in
ones accepted and not offered: server/edge/responses/tools.py), `tool_choice`, `parallel_tool_calls`,
`previous_response_id` (the earlier turn, read from the store, must be this key's), `store`,
`max_output_tokens`, `temperature`, `top_p`, `metadata`, `user`, `text.format` (structured outputs, as
chat's `response_format`) and `stream`. Accepted and not acted on (docs/api.md, "Codex CLI on
/v1/responses"): `reasoning` (no reasoning items: these models do not reason), `include`,
`client_metadata`, `prompt_cache_key`, `prompt_cache_retention`, `service_tier`, `text.verbosity`,
`stream_options`, `safety_identifier`, `max_tool_calls`, `top_logprobs`, `truncation` "auto" (a
conversation too long is still a 400), `background` false. The response object and its events are
server/edge/responses/serving.py's.

`conversation()` is the turn's own input as stored messages (OpenAI chat shape, server/edge/formats/tools.py): what
the store keeps for this turn; the history before it comes from the `previous_response_id` chain."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.protocol import INT32_MAX, MAX_MESSAGES, MAX_TOOLS, Name, SamplingExtensions, Seed, Text, _Strict, check_metadata
from liveloop.server.edge.formats.tools import JSONReply, Tool, ToolChoice, openai_choice
from liveloop.server.edge.responses.items import Item, conversation, typed_items
from liveloop.server.edge.responses.tools import AnyTool, Offer, known_tools, offer

INCLUDABLE = (
    "reasoning.encrypted_content", "message.output_text.logprobs", "message.input_image.image_url",
    "web_search_call.action.sources", "web_search_call.results", "file_search_call.results",
    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
)


class NamedFunction(_Strict):
    type: Literal["function", "custom"]
    name: Name


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: Name | None = None
    description: Annotated[Text, Field(max_length=8192)] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a `schema` is required for format type json_schema")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = None


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(SamplingExtensions):
    model: str
    input: Text | Annotated[list[Item], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: Text | None = None
    tools: Annotated[list[AnyTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    store: bool | None = None
    max_output_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    metadata: dict[Text, Text] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    text: TextConfig | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    truncation: Literal["disabled", "auto"] | None = None
    seed: Seed | None = Field(default=None, description="extension: the sampling seed")
    return_token_ids: bool = Field(default=False, description="extension (vLLM's): the prompt's and the reply's token ids")
    # accepted, not acted on (the module's docstring)
    reasoning: Reasoning | None = None
    include: Annotated[list[Literal[INCLUDABLE]], Field(max_length=16)] | None = None  # type: ignore[valid-type]
    client_metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=8192)]], Field(max_length=64)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_retention: Literal["in-memory", "in_memory", "24h"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    max_tool_calls: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    background: Literal[False] | None = None
    chars_param: ClassVar[str] = "input"

    _items = field_validator("input", mode="before")(lambda cls, v: typed_items(v))
    _tools = field_validator("tools", mode="before")(lambda cls, v: known_tools(v))

    _meta = field_validator("metadata")(lambda cls, v: check_metadata(v))

    @model_validator(mode="after")
    def _text(self) -> "ResponsesRequest":
        if isinstance(self.input, str) and not self.input:
            raise ValueError("input must not be empty")
        return self

    # what the shared pipeline reads (server/edge/pipeline/serving.py)
    @property
    def stored(self) -> bool:
        return True if self.store is None else self.store

    def stops(self) -> list[str]:
        return []

    def chars(self) -> int:
        if isinstance(self.input, str):
            return len(self.input) + len(self.instructions or "")
        return len(self.instructions or "") + sum(len(item.text()) for item in self.input)

    def conversation(self) -> list[dict[str, Any]]:
        """This turn's input as stored messages (server/edge/responses/items.py's `conversation`)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return conversation(self.input)

    def offer(self) -> Offer:
        """What the model is offered of `tools` (server/edge/responses/tools.py)."""
        return offer(self.tools or [])

    def tool_setup(self) -> tuple[list[Tool], ToolChoice, bool]:
        """The tools offered, the choice (OpenAI's rule) and whether several calls may come at once."""
        tools = self.offer().tools
        parallel = True if self.parallel_tool_calls is None else self.parallel_tool_calls
        return tools, openai_choice(self.tool_choice, bool(tools)), parallel

    def json_reply(self) -> JSONReply | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        return JSONReply(fmt.schema_ if fmt.type == "json_schema" else None)

    def options(self) -> dict[str, Any]:
        """What a read of the response echoes."""
        fmt = self.text.format if self.text is not None and self.text.format is not None else None
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedFunction) else self.tool_choice
        offered = self.offer()
        return {
            "instructions": self.instructions,
            "tool_choice": choice or ("auto" if offered.tools else "none"),
            "parallel_tool_calls": True if self.parallel_tool_calls is None else self.parallel_tool_calls,
            "max_output_tokens": self.max_output_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "text_format": None if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True),
            "user": self.user,
            "store": self.stored,
            "reasoning": None if self.reasoning is None else self.reasoning.model_dump(exclude_none=True),
            **offered.maps(),
        }

