"""Tool calls in what a model wrote, per model family (vLLM's `--tool-call-parser`): each family's
call syntax, read out of a whole reply (`ToolParser.parse`) or incrementally from a stream
(`ToolParser.stream`, in OpenAI's delta shape), and written as the xgrammar structural-tag format of
one call (`ToolParser.call_format`), so constrained decoding can force a call in exactly that syntax.

    parser = PARSERS["hermes"](["get_weather"])
    parser.parse('Let me check.\\n<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\\n</tool_call>')
    # Parsed(content='Let me check.', calls=(ToolCall(id='call_...', name='get_weather', arguments='{"city": "Oslo"}'),))

A call's arguments are the JSON text the model wrote, character for character. The content is the
text outside calls, less the whitespace next to a call, except that a whitespace run between a call
and text after it stays (as the separator) when there is content before that call:
`"A\\n<call>\\nB"` -> `"A\\nB"`, `"<call>\\nB"` -> `"B"`, `"A\\n<call>\\n"` -> `"A"`; text without
calls is kept as it is. A stream holds such whitespace back until it knows, so the text it sends is
exactly the final content.

A stream cannot take back what it sent: a call whose head was read stays a call even if the text
ends inside it (a generation cut by max_tokens) or its arguments turn out not to be JSON. `parse`
reads the whole text, so there such a call stays the text it was, and every call's arguments load.

Knows nothing of requests, schemas' meaning, tokenizers or HTTP: which family a model writes comes
from its chat template (`detect_parser`) or the configuration, which tools may be called from the
caller."""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from xgrammar.structural_tag import TagFormat


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
        arguments json.loads accepts stays the text it was."""
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream._checked()

    def _lead(self, text: str, first: bool) -> int:
        """Where a call object may begin in `text` (after the trigger, or after the previous call);
        raises _Undecided / _Mismatch."""
        return 0

    def _head(self, text: str, first: bool) -> _Head:
        """Whether `text` begins with a call's head (`{"name": "X", "arguments":`), up to the arguments."""
        try:
            i, _ = _token(text, self._lead(text, first), ("{",))
            brace = i - 1
            i, key = _token(text, i, ('"name"', *self._keys))
            if key != '"name"':
                return _Head("reordered", brace)
            i, _ = _token(text, i, (":",))
            i, name = self._name(text, i)
            i, _ = _token(text, i, (",",))
            i, _ = _token(text, i, self._keys)
            i, _ = _token(text, i, (":",))
        except _Undecided:
            return _Head("undecided")
        except _Mismatch:
            return _Head("mismatch")
        return _Head("call", i, name)

    def _name(self, text: str, i: int) -> tuple[int, str]:
        i = _skip_ws(text, i)
        if i == len(text):
            raise _Undecided
        if text[i] != '"':
            raise _Mismatch
        m = _STRING.match(text, i)
        if m is None:
            # a known name is at most 12 characters a code point (a surrogate pair's escapes), and quotes
            raise _Mismatch if len(text) - i > 12 * self._longest + 2 else _Undecided
        try:
            name = json.loads(m.group())
        except ValueError:
            raise _Mismatch from None
        if name not in self.tool_names:
            raise _Mismatch
        return m.end(), name

    def _tail(self, text: str, brace: bool) -> int:
        """The end of a call after its arguments (`brace`: the object's `}` is still to come); raises
        _Undecided / _Mismatch."""
        i = _token(text, 0, ("}",))[0] if brace else 0
        return _token(text, i, (self.end_tag,))[0] if self.end_tag else i

    def _whole_call(self, text: str) -> tuple[str, str] | None:
        """(name, arguments text) of a complete call object with its keys in any order, or None."""
        members = _members(text)
        if members is None:
            return None
        values = dict(members)
        arguments = [values[k] for k in self.argument_keys if k in values]
        if len(members) != 2 or len(values) != 2 or "name" not in values or len(arguments) != 1:
            return None
        name = json.loads(values["name"])
        return (name, arguments[0]) if isinstance(name, str) and name in self.tool_names else None


class HermesParser(ToolParser):
    """Hermes 2 Pro, Qwen2.5 / Qwen3, liveloop-tiny: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`,
    anywhere in the text, as many as the model writes."""

    name = "hermes"
    separator = "\n"
    trigger = "<tool_call>"
    end_tag = "</tool_call>"
    argument_keys = ("arguments",)
    written_open = "<tool_call>\n"
    written_close = "\n</tool_call>"


PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    """Llama 3.1 / 3.2 JSON calls: the message (after `<|python_tag|>`, optionally) is
    `{"name": ..., "parameters": ...}` objects separated by `;`. A message that does not start with one
    is text; `arguments` is read as well as `parameters`."""

    name = "llama3_json"
    separator = "; "
    trigger = None
    end_tag = ""
    argument_keys = ("parameters", "arguments")
    written_open = ""
    written_close = ""

    def _lead(self, text: str, first: bool) -> int:
        if not first:
            return _token(text, 0, (";",))[0]
        i = _skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, i):
            return i + len(PYTHON_TAG)
        if PYTHON_TAG.startswith(text[i:]):
            raise _Undecided
        return i


PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser)}


def detect_parser(chat_template: str | None) -> str | None:
    """The family whose calls a chat template renders, from its source; None if it shows none."""
    if not chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if PYTHON_TAG in chat_template or ("parameters" in chat_template and "ipython" in chat_template):
        return "llama3_json"
    return None


_State = Literal["text", "head", "object", "args", "value", "scalar", "tail"]


class ToolStream:
    """One reply read as it arrives: `feed` each piece of decoded text, `finish` when it ends.

    Text goes out as soon as it cannot be the start of a call; a call goes out when its head is read
    (index, id, name), then its arguments' text as it arrives. A head that is not a call's goes out as
    text; one with its keys in another order is held until its object ends, then goes out whole."""

    def __init__(self, parser: ToolParser):
        self._parser = parser
        self._state: _State = "head" if parser.trigger is None else "text"
        self._buf = ""  # arrived and not yet read
        self._content = _Content()
        self._calls: list[_Call] = []
        self._parts: list[str | _Call] = []  # the message as read, in order: text and calls
        self._scanner = _Scanner()  # states value and object
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

    def _checked(self) -> Parsed:
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
            keep = _partial_suffix(buf, trigger)
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
                self._scanner, self._brace, self._scanned = _Scanner(), head.end, head.end
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
        self._consume(_skip_ws(self._buf, 0))
        if not self._buf:
            return False
        if self._buf[0] in '{["':
            self._scanner = _Scanner()
            self._state = "value"
        elif _SCALAR.match(self._buf).end():
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
        n = _SCALAR.match(self._buf).end()
        if n == len(self._buf):
            return False  # a number or literal ends only where something else begins
        self._arguments(n)
        self._state = "tail"
        return True

    def _read_tail(self) -> bool:
        try:
            end = self._parser._tail(self._buf, self._tail_brace)
        except _Undecided:
            return False
        except _Mismatch:
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
    """The message's text outside calls as it settles, under the whitespace rule (module docstring)."""

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


@dataclass(frozen=True)
class _Head:
    kind: Literal["undecided", "mismatch", "reordered", "call"]
    end: int = 0  # call: after the `:` before the arguments; reordered: where the object starts
    name: str = ""


class _Undecided(Exception):
    """The text so far could still go either way."""


class _Mismatch(Exception):
    """The text so far cannot be what was expected."""


class _Scanner:
    """Where a JSON value that starts with `{`, `[` or `"` ends, read piece by piece: strings (with
    escapes) and nesting, not the full syntax (json.loads judges that)."""

    def __init__(self) -> None:
        self._closers: list[str] = []
        self._in_string = False
        self._escape = False

    def scan(self, text: str) -> tuple[int, Literal["more", "end", "bad"]]:
        """(characters read, status): "end" just after the value's last character, "bad" just before
        a character no JSON value has there, "more" when all of `text` was read."""
        i, n = 0, len(text)
        while i < n:
            ch = text[i]
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
                    if not self._closers:
                        return i + 1, "end"
                else:
                    i = _PLAIN.match(text, i).end()
                    continue
            elif ch == '"':
                self._in_string = True
            elif ch == "{" or ch == "[":
                self._closers.append("}" if ch == "{" else "]")
            elif ch == "}" or ch == "]":
                if not self._closers or self._closers.pop() != ch:
                    return i, "bad"
                if not self._closers:
                    return i + 1, "end"
            elif ch not in _JSON_OUTSIDE_STRINGS:
                return i, "bad"
            i += 1
        return n, "more"


_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_PLAIN = re.compile(r'[^"\\]+')
_SCALAR = re.compile(r"[A-Za-z0-9+\-.]*")
_JSON_OUTSIDE_STRINGS = frozenset(" \t\n\r,:+-." + string.ascii_letters + string.digits)
_ID_ALPHABET = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()


def _skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def _token(text: str, i: int, options: tuple[str, ...]) -> tuple[int, str]:
    """After JSON whitespace from i, one of `options`: (the index after it, which one); raises
    _Undecided if the text ends inside one, _Mismatch if it is none."""
    i = _skip_ws(text, i)
    for option in options:
        if text.startswith(option, i):
            return i + len(option), option
    rest = text[i:]
    if any(option.startswith(rest) for option in options):
        raise _Undecided
    raise _Mismatch


def _partial_suffix(text: str, word: str) -> int:
    """The length of the longest end of `text` that `word` starts with (short of all of `word`)."""
    return next((k for k in range(min(len(word) - 1, len(text)), 0, -1) if text.endswith(word[:k])), 0)


def _members(text: str) -> list[tuple[str, str]] | None:
    """Each member of a JSON object's text with its value's text as written; None if the text is not
    one JSON object."""
    try:
        if not isinstance(json.loads(text), dict):
            return None
        members, i = [], _skip_ws(text, 1)
        while text[i] != "}":
            key, i = _DECODER.raw_decode(text, i)
            start = _skip_ws(text, _skip_ws(text, i) + 1)  # past the `:`
            _, i = _DECODER.raw_decode(text, start)
            members.append((key, text[start:i]))
            i = _skip_ws(text, i)
            if text[i] == ",":
                i = _skip_ws(text, i + 1)
    except (ValueError, RecursionError):
        return None
    return members


def _new_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))
