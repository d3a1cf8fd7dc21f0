"""OpenAI chat completions' request (POST /v1/chat/completions), with tool calling (`tools`,
`tool_choice`, `parallel_tool_calls`; assistant turns with `tool_calls`, `tool` turns answering them)
and structured outputs (`response_format`: `json_object`, `json_schema`); the response bodies are made
by server/edge/chat/serving.py. A message an SDK echoes back from a response (`refusal`, `annotations`,
`audio` and `function_call` empty) is taken as it is."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from liveloop.server.edge.protocol import INT32_MAX, MAX_MESSAGES, MAX_TOOLS, Name, Text, _Sampling, _Strict
from liveloop.server.edge.formats.tools import JSONReply, Tool, ToolChoice, openai_choice



class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionDef(_Strict):
    name: Name
    description: Annotated[Text, Field(max_length=8192)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDef

    def tool(self) -> Tool:
        f = self.function
        return Tool.offered(f.name, f.description, f.parameters, f.strict)


class FunctionName(_Strict):
    name: Name


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Strict):
    name: Name
    arguments: Text


class ToolCallPart(_Strict):
    id: Annotated[Text, Field(min_length=1, max_length=64)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: Annotated[list[ToolCallPart], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    # what the SDK writes back when a client appends a response's message as it is
    refusal: None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None

    @model_validator(mode="after")
    def _shape(self) -> "ChatMessage":
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a `tool` message needs `tool_call_id` (the id of the call it answers)")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError("only a `tool` message has `tool_call_id`")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an `assistant` message has `tool_calls`")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("`content` is required (it may be null only in an assistant message with `tool_calls`)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def stored(self) -> dict[str, Any]:
        """The message in the stored (OpenAI chat) shape the template reads: text content, calls with
        their arguments as text; `developer` is a system turn."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["content"] = self.text() or None
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def chars(self) -> int:
        return len(self.text()) + sum(len(c.function.arguments) + len(c.function.name) for c in self.tool_calls or ())


class JSONSchemaFormat(_Strict):
    name: Name
    description: Annotated[Text, Field(max_length=8192)] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("`json_schema` with a `schema` is required for type json_schema")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chars_param: ClassVar[str] = "messages"

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("messages must not be empty")
        if len(v) > MAX_MESSAGES:
            raise ValueError(f"at most {MAX_MESSAGES} messages")
        return v

    @model_validator(mode="after")
    def _top(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        return self

    def chars(self) -> int:
        """The text's length, bounded before the chat template sees it (pipeline/serving.py `check_chars`)."""
        return sum(m.chars() for m in self.messages)

    def tool_setup(self) -> tuple[list[Tool], ToolChoice, bool]:
        """The tools offered, the choice (OpenAI's rule) and whether several calls may come at once."""
        tools = [t.tool() for t in self.tools or ()]
        return tools, openai_choice(self.tool_choice, bool(tools)), self.parallel_tool_calls

    def json_reply(self) -> JSONReply | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        return JSONReply(fmt.json_schema.schema_ if fmt.type == "json_schema" else None)
