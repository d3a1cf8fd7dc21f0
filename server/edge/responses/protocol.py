"""The Responses API's request (POST /v1/responses), as the official `openai` client and the Agents
SDK send it: `input` (a string, or items: messages with text content, `function_call` items the model
made earlier, `function_call_output` items answering them), `instructions` (a system turn for this
request only), `tools` (function tools), `tool_choice`, `parallel_tool_calls`, `previous_response_id`
(the earlier turn, read from the store, must be this key's), `store`, `max_output_tokens`,
`temperature`, `top_p`, `metadata`, `user`, `text.format` (structured outputs, as chat's
`response_format`) and `stream`. Other item types (images, files, reasoning, item references) and
built-in tools are a 400 naming them. The response object and its events are server/edge/responses/serving.py's.

`conversation()` is the turn's own input as stored messages (OpenAI chat shape, server/edge/formats/tools.py): what
the store keeps for this turn; the history before it comes from the `previous_response_id` chain."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.protocol import INT32_MAX, MAX_MESSAGES, MAX_TOOLS, Name, SamplingExtensions, Seed, Text, _Strict, check_metadata
from liveloop.server.edge.formats.tools import JSONReply, Tool, ToolChoice, openai_choice

_ITEM_TYPES = ("message", "function_call", "function_call_output")
_PART_TYPES = ("input_text", "output_text", "text")


class TextContent(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: Text
    annotations: list[Any] | None = None  # an output_text echoed back
    logprobs: list[Any] | None = None


def _known_parts(v: Any, where: str) -> Any:
    if isinstance(v, list):
        for i, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PART_TYPES:
                raise ValueError(f"{where} content part {i}: type `{kind}` is not supported (only input_text and output_text)")
    return v


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[TextContent]
    id: Annotated[str, Field(max_length=64)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _known_parts(v.get("content"), "message")
        return v

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[Text, Field(min_length=1, max_length=64)]
    name: Name
    arguments: Text
    id: Annotated[str, Field(max_length=64)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[Text, Field(min_length=1, max_length=64)]
    output: Text | list[TextContent]
    id: Annotated[str, Field(max_length=64)] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _known_parts(v.get("output"), "function_call_output")
        return v

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


def _typed_items(v: Any) -> Any:
    """Items without `type` are messages (the SDK's EasyInputMessage); unknown types are a 400 naming them."""
    if not isinstance(v, list):
        return v
    out = []
    for i, item in enumerate(v):
        if isinstance(item, dict):
            kind = item.get("type", "message")
            if kind not in _ITEM_TYPES:
                raise ValueError(f"input item {i}: type `{kind}` is not supported (only {', '.join(_ITEM_TYPES)})")
            item = {**item, "type": kind}
        out.append(item)
    return out


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Name
    description: Annotated[Text, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _function(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("type") != "function":
            raise ValueError(f"tool type `{v.get('type')}` is not served (only function tools)")
        return v


class NamedFunction(_Strict):
    type: Literal["function"]
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


class ResponsesRequest(SamplingExtensions):
    model: str
    input: Text | Annotated[list[Item], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: Text | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
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
    truncation: Literal["disabled"] | None = None
    seed: Seed | None = Field(default=None, description="extension: the sampling seed")
    chars_param: ClassVar[str] = "input"

    _items = field_validator("input", mode="before")(lambda cls, v: _typed_items(v))

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
        n = len(self.instructions or "")
        for item in self.input:
            n += len(item.text()) if not isinstance(item, FunctionCallItem) else len(item.arguments) + len(item.name)
        return n

    def conversation(self) -> list[dict[str, Any]]:
        """This turn's input as stored messages: a message item is a turn, consecutive function_call
        items are one assistant turn's calls (after that turn's text, when the item before them is it),
        a function_call_output is a tool turn."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for item in self.input:
            if isinstance(item, MessageItem):
                out.append({"role": "system" if item.role == "developer" else item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                    last["content"] = last["content"] or None
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        return out

    def tool_setup(self) -> tuple[list[Tool], ToolChoice, bool]:
        """The tools offered, the choice (OpenAI's rule) and whether several calls may come at once."""
        tools = [Tool.offered(t.name, t.description, t.parameters, t.strict) for t in self.tools or ()]
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
        return {
            "instructions": self.instructions,
            "tool_choice": choice or ("auto" if self.tools else "none"),
            "parallel_tool_calls": True if self.parallel_tool_calls is None else self.parallel_tool_calls,
            "max_output_tokens": self.max_output_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "text_format": None if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True),
            "user": self.user,
            "store": self.stored,
        }

