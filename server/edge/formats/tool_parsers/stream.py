"""The incremental reading of a reply as it streams (`ToolStream`), for any family: which text is
content and when it is safe to send, which is a call, and its arguments' text as it arrives. The
family's syntax comes from its `ToolParser` (base.py); a whole reply is read by the same stream
(`ToolParser.parse`)."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from liveloop.server.edge.formats.tool_parsers.json_text import (
    SCALAR,
    Mismatch,
    Undecided,
    ValueScanner,
    partial_suffix,
    skip_ws,
)
from liveloop.server.edge.formats.tool_parsers.results import CallDelta, Parsed, StreamDelta, ToolCall

if TYPE_CHECKING:
    from liveloop.server.edge.formats.tool_parsers.base import ToolParser

_ID_ALPHABET = string.ascii_letters + string.digits
_State = Literal["text", "head", "object", "args", "value", "scalar", "tail"]


class ToolStream:
    """One reply read as it arrives: `feed` each piece of decoded text, `finish` when it ends.

    Text goes out as soon as it cannot be the start of a call; a call goes out when its head is read
    (index, id, name), then its arguments' text as it arrives. A head that is not a call's goes out as
    text; one with its keys in another order is held until its object ends, then goes out whole.

    A call's arguments are the JSON text the model wrote, character for character. A stream cannot
    take back what it sent: a call whose head was read stays a call even if the text ends inside it
    (a generation cut by max_tokens) or its arguments turn out not to be JSON."""

    def __init__(self, parser: ToolParser):
        self._parser = parser
        self._state: _State = "head" if parser.trigger is None else "text"
        self._buf = ""  # arrived and not yet read
        self._content = _Content()
        self._calls: list[_Call] = []
        self._parts: list[str | _Call] = []  # the message as read, in order: text and calls
        self._scanner = ValueScanner()  # states value and object
        self._scanned = 0  # state object: how much of _buf the scanner has read
        self._brace = 0  # state object: where the object starts in _buf
        self._tail_brace = True  # state tail: the call object's `}` is still to come
        self._sent_text: list[str] = []
        self._sent_calls: list[CallDelta] = []

    def feed(self, text: str) -> StreamDelta:
        self._buf += text
        while self._step():
            pass
        return self._delta()

    def finish(self) -> StreamDelta:
        """The text ended: what was held back goes out (an unfinished call stays unfinished)."""
        match self._state:
            case "text":
                self._text(self._buf)
            case "head" | "object":
                self._text((self._parser.trigger or "") + self._buf)
            case "scalar":
                self._arguments(len(self._buf))
            case "tail":
                self._consume(len(self._buf))
        self._buf = ""
        self._sent_text.append(self._content.finish())
        return self._delta()

    @property
    def result(self) -> Parsed:
        """Everything read so far as one message; the calls as they were sent, finished or not."""
        return Parsed(self._content.text or None, tuple(c.tool_call() for c in self._calls))

    def checked(self) -> Parsed:
        """The message with every call that did not finish as valid JSON read as the text it was."""
        content, calls = _Content(), []
        for part in self._parts:
            if isinstance(part, str):
                content.add(part)
            elif part.valid:
                content.call()
                calls.append(part.tool_call())
            else:
                content.add(part.source())
        content.finish()
        return Parsed(content.text or None, tuple(calls))

    # -- reading ------------------------------------------------------------------------------------
    def _step(self) -> bool:
        """Read on in the current state; False when it needs more text."""
        match self._state:
            case "text":
                return self._read_text()
            case "head":
                return self._read_head()
            case "object":
                return self._read_object()
            case "args":
                return self._read_args()
            case "value":
                return self._read_value()
            case "scalar":
                return self._read_scalar()
            case "tail":
                return self._read_tail()

    def _read_text(self) -> bool:
        trigger, buf = self._parser.trigger, self._buf
        if trigger is None:
            self._text(buf)
            self._buf = ""
            return False
        at = buf.find(trigger)
        if at == -1:
            keep = partial_suffix(buf, trigger)
            self._text(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        self._text(buf[:at])
        self._buf = buf[at + len(trigger) :]
        self._state = "head"
        return True

    def _read_head(self) -> bool:
        head = self._parser._head(self._buf, first=not self._calls)
        match head.kind:
            case "undecided":
                return False
            case "mismatch":
                self._not_a_call()
            case "reordered":
                self._scanner, self._brace, self._scanned = ValueScanner(), head.end, head.end
                self._state = "object"
            case "call":
                self._open(head.name)
                self._consume(head.end)
                self._state = "args"
        return True

    def _read_object(self) -> bool:
        n, status = self._scanner.scan(self._buf[self._scanned :])
        self._scanned += n
        if status == "more":
            return False
        call = self._parser._whole_call(self._buf[self._brace : self._scanned]) if status == "end" else None
        if call is None:
            self._not_a_call()
            return True
        name, arguments = call
        self._open(name)
        self._calls[-1].arguments.append(arguments)
        self._sent_calls.append(CallDelta(len(self._calls) - 1, None, None, arguments))
        self._consume(self._scanned)
        self._tail_brace = False
        self._state = "tail"
        return True

    def _read_args(self) -> bool:
        self._consume(skip_ws(self._buf, 0))
        if not self._buf:
            return False
        if self._buf[0] in '{["':
            self._scanner = ValueScanner()
            self._state = "value"
        elif SCALAR.match(self._buf).end():
            self._state = "scalar"
        else:
            self._state = "tail"  # no value: the call cannot be valid
        return True

    def _read_value(self) -> bool:
        n, status = self._scanner.scan(self._buf)
        self._arguments(n)
        if status == "more":
            return False
        self._state = "tail"  # at its end, or at a character no JSON has there
        return True

    def _read_scalar(self) -> bool:
        n = SCALAR.match(self._buf).end()
        if n == len(self._buf):
            return False  # a number or literal ends only where something else begins
        self._arguments(n)
        self._state = "tail"
        return True

    def _read_tail(self) -> bool:
        try:
            end = self._parser._tail(self._buf, self._tail_brace)
        except Undecided:
            return False
        except Mismatch:
            self._state = "text"  # not the call's end: the call stays unfinished, what follows is text
        else:
            self._consume(end)
            self._calls[-1].closed = True
            self._state = "head" if self._parser.trigger is None else "text"
        self._tail_brace = True
        return True

    # -- what goes out ------------------------------------------------------------------------------
    def _not_a_call(self) -> None:
        """What followed the trigger is not a call: the trigger is text, the rest is read again as text."""
        self._text(self._parser.trigger or "")
        self._state = "text"

    def _text(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._sent_text.append(self._content.add(text))

    def _open(self, name: str) -> None:
        self._content.call()
        call = _Call(_new_id(), name, [self._parser.trigger or ""])
        self._sent_calls.append(CallDelta(len(self._calls), call.id, name, ""))
        self._calls.append(call)
        self._parts.append(call)

    def _arguments(self, n: int) -> None:
        """The next n characters are the current call's arguments."""
        if n:
            self._calls[-1].arguments.append(self._buf[:n])
            self._sent_calls.append(CallDelta(len(self._calls) - 1, None, None, self._buf[:n]))
            self._consume(n)

    def _consume(self, n: int) -> None:
        """The next n characters belong to the current call."""
        self._calls[-1].read.append(self._buf[:n])
        self._buf = self._buf[n:]

    def _delta(self) -> StreamDelta:
        calls: list[CallDelta] = []
        for d in self._sent_calls:
            if calls and calls[-1].index == d.index:
                calls[-1] = replace(calls[-1], arguments=calls[-1].arguments + d.arguments)
            else:
                calls.append(d)
        delta = StreamDelta("".join(self._sent_text), tuple(calls))
        self._sent_text.clear()
        self._sent_calls.clear()
        return delta


@dataclass
class _Call:
    """A call as it is read: its arguments so far, the text it was read from, whether it closed."""

    id: str
    name: str
    read: list[str]  # the text the call spans, arguments included
    arguments: list[str] = field(default_factory=list)
    closed: bool = False

    def source(self) -> str:
        return "".join(self.read)

    @property
    def valid(self) -> bool:
        if not self.closed:
            return False
        try:
            json.loads("".join(self.arguments))
        except (ValueError, RecursionError):
            return False
        return True

    def tool_call(self) -> ToolCall:
        return ToolCall(self.id, self.name, "".join(self.arguments))


class _Content:
    """The message's text outside calls as it settles. The content is the text outside calls, less
    the whitespace next to a call, except that a whitespace run between a call and text after it
    stays (as the separator) when there is content before that call: `"A\\n<call>\\nB"` -> `"A\\nB"`,
    `"<call>\\nB"` -> `"B"`, `"A\\n<call>\\n"` -> `"A"`; text without calls is kept as it is. A
    stream holds such whitespace back until it knows, so the text it sends is exactly the final
    content."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._space = ""  # whitespace held until what follows it is known
        self._after_call = False  # no text since the last call

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def add(self, text: str) -> str:
        """Text arrived; returns what of it (and of the held whitespace) is settled content."""
        body = text.rstrip()
        if not body:
            self._space += text
            return ""
        lead = len(body) - len(body.lstrip())
        space = self._space + body[:lead] if self._pieces or not self._after_call else ""
        settled = space + body[lead:]
        self._pieces.append(settled)
        self._space = text[len(body) :]
        self._after_call = False
        return settled

    def call(self) -> None:
        self._space = ""
        self._after_call = True

    def finish(self) -> str:
        settled = "" if self._after_call else self._space
        if settled:
            self._pieces.append(settled)
        self._space = ""
        return settled


def _new_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))
