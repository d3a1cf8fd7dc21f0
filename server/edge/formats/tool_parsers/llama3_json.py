"""The llama3_json tool-call family: Llama 3.1 / 3.2's JSON calls."""

from __future__ import annotations

from liveloop.server.edge.formats.tool_parsers.base import ToolParser, register
from liveloop.server.edge.formats.tool_parsers.json_text import Undecided, skip_ws, token

PYTHON_TAG = "<|python_tag|>"


@register
class Llama3JsonParser(ToolParser):
    """The message (after `<|python_tag|>`, optionally) is `{"name": ..., "parameters": ...}` objects
    separated by `;`. A message that does not start with one is text; `arguments` is read as well as
    `parameters`."""

    name = "llama3_json"
    separator = "; "
    trigger = None
    end_tag = ""
    argument_keys = ("parameters", "arguments")
    written_open = ""
    written_close = ""

    @classmethod
    def shows_in(cls, chat_template: str) -> bool:
        return PYTHON_TAG in chat_template or ("parameters" in chat_template and "ipython" in chat_template)

    def _lead(self, text: str, first: bool) -> int:
        if not first:
            return token(text, 0, (";",))[0]
        i = skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, i):
            return i + len(PYTHON_TAG)
        if PYTHON_TAG.startswith(text[i:]):
            raise Undecided
        return i
