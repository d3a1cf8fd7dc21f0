"""Tools for a chat template that renders none (SmolLM2's plain ChatML, say): which call syntax such a
model is served with, and the conversation rewritten so that the template, given only roles and text,
shows the tools the way Qwen2.5 / Qwen3's template does (the `hermes` syntax,
server/edge/formats/tool_parsers/).

- The offered tools go into the system turn, after its text and a blank line (after the template's
  default system prompt when the conversation has none), in Qwen's words, one JSON definition a line.
- An assistant turn with calls is its text, then each call as `<tool_call>\\n{"name": ..., "arguments":
  ...}\\n</tool_call>`, one a line, its arguments the text the model wrote (a sampled call sent back
  renders as it was sampled).
- A run of `tool` messages is one user turn of `<tool_response>\\n...\\n</tool_response>` blocks.

The model's own template still renders the result: its special tokens, its role markers, its system
default. A template that renders tools itself is never rewritten (`tool_format`). Knows nothing of
tokenizers or requests: the messages are in the stored (OpenAI chat) shape, the tools their OpenAI
definitions (server/edge/formats/tools.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from liveloop.server.edge.formats.tool_parsers import HermesParser, detect_parser

TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_TOOL_NAMES = re.compile(r"\btools\b|\btool_calls\b")
_PROBE = "\x00LIVELOOP-PROBE\x00"  # a message's text no template writes of its own


@dataclass(frozen=True)
class ToolFormat:
    """How a model's tools are served: the parser its calls are read with (None: tools are refused),
    and whether liveloop writes the tools into the conversation's text (its template renders none)."""

    parser: str | None
    in_text: bool = False


def renders_tools(chat_template: str) -> bool:
    """Whether a chat template's source handles tools: it reads a `tools` variable or messages' `tool_calls`."""
    return _TOOL_NAMES.search(chat_template) is not None


def tool_format(chat_template: str | None, setting: str) -> ToolFormat:
    """The tool format of a model with this chat template under `[engine] tool_call_parser` (`setting`):
    auto reads the family from the template, and a template that renders no tools gets hermes, written
    into the text here; an explicit hermes on such a template is written into the text too."""
    if setting == "none":
        return ToolFormat(None)
    toolless = not renders_tools(chat_template) if chat_template else False
    parser = setting if setting != "auto" else detect_parser(chat_template) or ("hermes" if toolless else None)
    return ToolFormat(parser, toolless and parser == HermesParser.name)


def default_system(render: Callable[[list[dict[str, Any]]], str]) -> str | None:
    """The system prompt a chat template writes when a conversation has none (SmolLM2's "You are a
    helpful AI assistant named SmolLM, ..."); None if it writes none. `render`: messages -> the
    template's text, without the generation prompt. A template that fails on the probe has none."""
    user = {"role": "user", "content": _PROBE}
    try:
        alone = render([user])
        given = render([{"role": "system", "content": _PROBE}, user])
    except Exception:  # noqa: BLE001 - a template that refuses a system turn: nothing to keep
        return None
    head, _, tail = given.partition(_PROBE)
    if _PROBE not in tail or len(alone) <= len(head) + len(tail) or not (alone.startswith(head) and alone.endswith(tail)):
        return None  # the system turn is not where the probe put it, or the template writes none by default
    return alone[len(head) : len(alone) - len(tail)]


@dataclass(frozen=True)
class TextTools:
    """The tools of a template that renders none, written into the messages as Qwen's template writes them."""

    default_system: str | None = None  # what the template's system turn says when the conversation has none

    def messages(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """`messages` (stored shape) as plain role-and-text turns, `tools` (OpenAI definitions) in the
        system turn; a conversation without tools, calls or results comes back as it is (copied)."""
        out = _turns(messages)
        if not tools:
            return out
        text = tools_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": (out[0].get("content") or "") + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": f"{self.default_system}\n\n{text}" if self.default_system else text})
        return out


def tools_text(tools: Sequence[dict[str, Any]]) -> str:
    """The tools' part of the system turn, one definition a line (as a template's `tojson` writes it)."""
    return TOOLS_HEAD + "".join("\n" + _json(t) for t in tools) + TOOLS_TAIL


def call_text(call: dict[str, Any]) -> str:
    """One call (OpenAI chat shape) as a hermes call; arguments that are text are written as they are."""
    function = call["function"]
    arguments = function["arguments"]
    arguments = arguments if isinstance(arguments, str) else _json(arguments)
    head = '{"name": "' + json.dumps(function["name"])[1:-1] + '", "arguments": '
    return HermesParser.written_open + head + arguments + "}" + HermesParser.written_close


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant turn's text: its content, then its calls, one a line."""
    content = message.get("content") or ""
    return "\n".join(([content] if content else []) + [call_text(c) for c in message.get("tool_calls") or ()])


def results_text(results: Sequence[dict[str, Any]]) -> str:
    """A run of tool messages as one user turn's text."""
    return "\n".join("<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>" for m in results)


def _turns(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for results, run in groupby(messages, key=lambda m: m.get("role") == "tool"):
        if results:
            out.append({"role": "user", "content": results_text(list(run))})
        else:
            out.extend(map(_turn, run))
    return out


def _turn(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") == "assistant" and message.get("tool_calls"):
        return {"role": "assistant", "content": assistant_text(message)}
    return dict(message)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
