"""The tool-call parser base class, one family's call syntax (vLLM's `--tool-call-parser`), and the
registry of families by name (`PARSERS`, filled by `register`), with `detect_parser`, how
`tool_call_parser = "auto"` picks a family from a chat template's source.

A family class sets its syntax's markers (class variables) and, where its calls do not open with a
trigger, how a call object is led into (`_lead`); reading a call's head and tail and a whole call
object with reordered keys is shared here. The reading itself, whole or streamed, is `ToolStream`'s
(stream.py)."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from liveloop.server.edge.formats.tool_parsers.json_text import STRING, Mismatch, Undecided, members, skip_ws, token
from liveloop.server.edge.formats.tool_parsers.results import Parsed
from liveloop.server.edge.formats.tool_parsers.stream import ToolStream

if TYPE_CHECKING:
    from xgrammar.structural_tag import TagFormat


class ToolParser:
    """One family's call syntax. Only calls of `tool_names` are calls; anything else is text."""

    name: ClassVar[str]
    separator: ClassVar[str]  # between two calls that constrained decoding writes
    trigger: ClassVar[str | None]  # opens a call anywhere in the text; None: only the message's start and calls
    end_tag: ClassVar[str]  # closes a call after its object ("" none)
    argument_keys: ClassVar[tuple[str, ...]]  # the arguments' key; call_format writes the first
    written_open: ClassVar[str]  # what call_format writes before the call object
    written_close: ClassVar[str]  # and after it

    def __init__(self, tool_names: Collection[str]):
        self.tool_names = frozenset(tool_names)
        self._longest = max(map(len, self.tool_names), default=0)
        self._keys = tuple(f'"{k}"' for k in self.argument_keys)

    @classmethod
    def shows_in(cls, chat_template: str) -> bool:
        """Whether a chat template's source renders this family's calls."""
        return False

    def call_format(self, name: str, arguments: Any) -> TagFormat:
        """One call of `name` as this family writes it, its arguments in the xgrammar format
        `arguments` (the JSON a tool's schema accepts: server/edge/formats/tools.py `json_format`)."""
        from xgrammar.structural_tag import TagFormat

        head = '{"name": "' + json.dumps(name)[1:-1] + '", "' + self.argument_keys[0] + '": '
        return TagFormat(begin=self.written_open + head, content=arguments, end="}" + self.written_close)

    def stream(self) -> ToolStream:
        return ToolStream(self)

    def parse(self, text: str) -> Parsed:
        """As a stream of the whole text would read it, except that a call that did not finish with
        arguments json.loads accepts stays the text it was: a stream cannot take back a call whose
        head it sent (a generation cut by max_tokens, arguments that are not JSON), `parse` reads the
        whole text, so every call it returns has arguments that load."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.checked()

    def _lead(self, text: str, first: bool) -> int:
        """Where a call object may begin in `text` (after the trigger, or after the previous call);
        raises Undecided / Mismatch."""
        return 0

    def _head(self, text: str, first: bool) -> Head:
        """Whether `text` begins with a call's head (`{"name": "X", "arguments":`), up to the arguments."""
        try:
            i, _ = token(text, self._lead(text, first), ("{",))
            brace = i - 1
            i, key = token(text, i, ('"name"', *self._keys))
            if key != '"name"':
                return Head("reordered", brace)
            i, _ = token(text, i, (":",))
            i, name = self._name(text, i)
            i, _ = token(text, i, (",",))
            i, _ = token(text, i, self._keys)
            i, _ = token(text, i, (":",))
        except Undecided:
            return Head("undecided")
        except Mismatch:
            return Head("mismatch")
        return Head("call", i, name)

    def _name(self, text: str, i: int) -> tuple[int, str]:
        i = skip_ws(text, i)
        if i == len(text):
            raise Undecided
        if text[i] != '"':
            raise Mismatch
        m = STRING.match(text, i)
        if m is None:
            # a known name is at most 12 characters a code point (a surrogate pair's escapes), and quotes
            raise Mismatch if len(text) - i > 12 * self._longest + 2 else Undecided
        try:
            name = json.loads(m.group())
        except ValueError:
            raise Mismatch from None
        if name not in self.tool_names:
            raise Mismatch
        return m.end(), name

    def _tail(self, text: str, brace: bool) -> int:
        """The end of a call after its arguments (`brace`: the object's `}` is still to come); raises
        Undecided / Mismatch."""
        i = token(text, 0, ("}",))[0] if brace else 0
        return token(text, i, (self.end_tag,))[0] if self.end_tag else i

    def _whole_call(self, text: str) -> tuple[str, str] | None:
        """(name, arguments text) of a complete call object with its keys in any order, or None."""
        found = members(text)
        if found is None:
            return None
        values = dict(found)
        arguments = [values[k] for k in self.argument_keys if k in values]
        if len(found) != 2 or len(values) != 2 or "name" not in values or len(arguments) != 1:
            return None
        name = json.loads(values["name"])
        return (name, arguments[0]) if isinstance(name, str) and name in self.tool_names else None


@dataclass(frozen=True)
class Head:
    """How the text after a trigger (or a previous call) begins, as `ToolParser._head` read it."""

    kind: Literal["undecided", "mismatch", "reordered", "call"]
    end: int = 0  # call: after the `:` before the arguments; reordered: where the object starts
    name: str = ""


# Every family, by name, in the order detect_parser tries them (the order their modules register).
PARSERS: dict[str, type[ToolParser]] = {}


def register(parser: type[ToolParser]) -> type[ToolParser]:
    """Class decorator: `parser` is the family of its name."""
    PARSERS[parser.name] = parser
    return parser


def detect_parser(chat_template: str | None) -> str | None:
    """The family whose calls a chat template renders, from its source; None if it shows none."""
    if not chat_template:
        return None
    return next((name for name, parser in PARSERS.items() if parser.shows_in(chat_template)), None)
