"""What the tool-call parsers hand out: a whole reply read (`Parsed`, its `ToolCall`s) and what one
piece of a stream sends on (`StreamDelta`, its `CallDelta`s, in OpenAI's delta shape)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the JSON text of the arguments as the model wrote it


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class CallDelta:
    """One fragment of a streamed call: the first names it, the rest carry its arguments' text on."""

    index: int  # the call's position among this message's calls
    id: str | None  # the call's first delta only
    name: str | None  # the call's first delta only
    arguments: str


@dataclass(frozen=True)
class StreamDelta:
    text: str  # content safe to show now
    calls: tuple[CallDelta, ...]
