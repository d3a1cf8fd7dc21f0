"""The hermes tool-call family: Hermes 2 Pro, Qwen2.5 / Qwen3, liveloop-tiny."""

from __future__ import annotations

from liveloop.server.edge.formats.tool_parsers.base import ToolParser, register


@register
class HermesParser(ToolParser):
    """`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, anywhere in the text, as many as
    the model writes."""

    name = "hermes"
    separator = "\n"
    trigger = "<tool_call>"
    end_tag = "</tool_call>"
    argument_keys = ("arguments",)
    written_open = "<tool_call>\n"
    written_close = "\n</tool_call>"

    @classmethod
    def shows_in(cls, chat_template: str) -> bool:
        return "<tool_call>" in chat_template
