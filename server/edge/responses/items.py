"""The Responses API's input items (POST /v1/responses `input`) and what the model sees of them: the
stored messages (OpenAI chat shape, server/edge/formats/tools.py) a turn's items become.

Served: `message` (roles user, assistant, system, developer; text parts, and in tool outputs images
and encrypted parts shown as a placeholder), `function_call` (with Codex's `namespace`),
`function_call_output`, `custom_tool_call` (freeform `input`: stored as a call whose arguments are
`{"input": ...}`, the way server/edge/responses/tools.py offers custom tools) and
`custom_tool_call_output`. Accepted and dropped, never shown to the model (`DROPPED`, each with its
reason): reasoning items (this server's models write no reasoning and cannot read another's encrypted
reasoning), the calls of built-in tools it does not serve and their outputs, compaction and client-side
snapshots. An item type outside both is a 400 naming it."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from liveloop.server.edge.protocol import Name, Text, _Strict

_PART_TYPES = ("input_text", "output_text", "text")
_OUTPUT_PART_TYPES = _PART_TYPES + ("input_image", "input_file", "encrypted_content")
_Status = Literal["in_progress", "completed", "incomplete"]
_Id = Annotated[str, Field(max_length=128)]
_CallId = Annotated[Text, Field(min_length=1, max_length=128)]
OMITTED = "[{kind} omitted: this model reads text only]"

DROPPED = {  # item type -> why the model does not see it
    "reasoning": "reasoning is not produced by this server; another model's (encrypted) reasoning cannot be read",
    "web_search_call": "built-in web_search is not served",
    "tool_search_call": "built-in tool_search is not served",
    "tool_search_output": "built-in tool_search is not served",
    "image_generation_call": "built-in image_generation is not served",
    "local_shell_call": "built-in local_shell is not served",
    "local_shell_call_output": "built-in local_shell is not served",
    "file_search_call": "built-in file_search is not served",
    "compaction": "encrypted compaction summaries cannot be read",
    "compaction_summary": "encrypted compaction summaries cannot be read",
    "context_compaction": "encrypted compaction summaries cannot be read",
    "compaction_trigger": "a compaction request control; compaction is not served",
    "ghost_snapshot": "a client-side snapshot, never a model turn",
    "additional_tools": "tools are taken from `tools` only",
    "item_reference": "item references are not resolved (send the item itself)",
}
SERVED = ("message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")


class TextContent(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: Text
    annotations: list[Any] | None = None  # an output_text echoed back
    logprobs: list[Any] | None = None


class OpaquePart(_Strict):
    """A tool output's image, file or encrypted part: the model sees a placeholder."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_image", "input_file", "encrypted_content"]


def _known_parts(v: Any, where: str, kinds: tuple[str, ...]) -> Any:
    if isinstance(v, list):
        for i, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in kinds:
                raise ValueError(f"{where} content part {i}: type `{kind}` is not supported (only {', '.join(kinds)})")
    return v


def _parts_text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextContent) else OMITTED.format(kind=p.type.removeprefix("input_")) for p in content)


class _Passthrough(_Strict):
    """What Codex stamps on its items (`internal_chat_message_metadata_passthrough`): accepted, unused."""

    internal_chat_message_metadata_passthrough: dict[str, Any] | None = None


class MessageItem(_Passthrough):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[TextContent]
    id: _Id | None = None
    status: _Status | None = None
    phase: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _known_parts(v.get("content"), "message", _PART_TYPES)
        return v

    def text(self) -> str:
        return _parts_text(self.content)


class FunctionCallItem(_Passthrough):
    type: Literal["function_call"]
    call_id: _CallId
    name: Name
    namespace: Name | None = None  # Codex: the namespace tool the function was offered in
    arguments: Text
    id: _Id | None = None
    status: _Status | None = None

    def text(self) -> str:
        return self.name + self.arguments


class _Output(_Passthrough):
    call_id: _CallId
    output: Text | list[TextContent | OpaquePart]
    id: _Id | None = None
    status: _Status | None = None

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        if isinstance(v, dict):
            _known_parts(v.get("output"), str(v.get("type")), _OUTPUT_PART_TYPES)
        return v

    def text(self) -> str:
        return _parts_text(self.output)


class FunctionCallOutputItem(_Output):
    type: Literal["function_call_output"]


class CustomToolCallItem(_Passthrough):
    type: Literal["custom_tool_call"]
    call_id: _CallId
    name: Name
    namespace: Name | None = None
    input: Text
    id: _Id | None = None
    status: _Status | None = None

    def text(self) -> str:
        return self.name + self.input


class CustomToolCallOutputItem(_Output):
    type: Literal["custom_tool_call_output"]
    name: Name | None = None


class DroppedItem(_Strict):
    """An item the model does not see (`DROPPED` says why); its fields are not read."""

    model_config = ConfigDict(extra="allow")
    type: Literal[tuple(DROPPED)]  # type: ignore[valid-type]

    def text(self) -> str:
        return ""


Item = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | CustomToolCallItem | CustomToolCallOutputItem | DroppedItem,
    Field(discriminator="type"),
]


def typed_items(v: Any) -> Any:
    """Items without `type` are messages (the SDK's EasyInputMessage); unknown types are a 400 naming them."""
    if not isinstance(v, list):
        return v
    out = []
    for i, item in enumerate(v):
        if isinstance(item, dict):
            kind = item.get("type", "message")
            if kind not in SERVED and kind not in DROPPED:
                raise ValueError(f"input item {i}: type `{kind}` is not supported (served: {', '.join(SERVED)}; "
                                 f"accepted and ignored: {', '.join(DROPPED)})")
            item = {**item, "type": kind}
        out.append(item)
    return out


def custom_arguments(text: str) -> str:
    """A custom (freeform) tool call's input as the arguments of the function it is offered as."""
    return json.dumps({"input": text})


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversation(items: list[Any]) -> list[dict[str, Any]]:
    """Items as stored messages: a message item is a turn (consecutive system and developer messages one
    system turn), consecutive calls are one assistant turn's calls (after that turn's text, when the
    item before them is it), an output is a tool turn; dropped items are skipped."""
    out: list[dict[str, Any]] = []
    for item in items:
        last = out[-1] if out else None
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            if role == "system" and last is not None and last["role"] == "system":
                last["content"] += "\n\n" + item.text()
            else:
                out.append({"role": role, "content": item.text()})
        elif isinstance(item, (FunctionCallItem, CustomToolCallItem)):
            args = item.arguments if isinstance(item, FunctionCallItem) else custom_arguments(item.input)
            call = _call(item.call_id, item.name, args)
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, (FunctionCallOutputItem, CustomToolCallOutputItem)):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return out
