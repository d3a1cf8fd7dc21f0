"""The JSON text the tool-call parsers read by hand: expected tokens after whitespace (`token`),
where a value that is still arriving ends (`ValueScanner`), an object's members as written
(`members`), and the two ways a partial read turns out (`Undecided`, `Mismatch`)."""

from __future__ import annotations

import json
import re
import string
from typing import Literal

WS = re.compile(r"[ \t\n\r]*")
STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
SCALAR = re.compile(r"[A-Za-z0-9+\-.]*")
_PLAIN = re.compile(r'[^"\\]+')
_JSON_OUTSIDE_STRINGS = frozenset(" \t\n\r,:+-." + string.ascii_letters + string.digits)
_DECODER = json.JSONDecoder()


class Undecided(Exception):
    """The text so far could still go either way."""


class Mismatch(Exception):
    """The text so far cannot be what was expected."""


class ValueScanner:
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


def skip_ws(text: str, i: int) -> int:
    return WS.match(text, i).end()


def token(text: str, i: int, options: tuple[str, ...]) -> tuple[int, str]:
    """After JSON whitespace from i, one of `options`: (the index after it, which one); raises
    Undecided if the text ends inside one, Mismatch if it is none."""
    i = skip_ws(text, i)
    for option in options:
        if text.startswith(option, i):
            return i + len(option), option
    rest = text[i:]
    if any(option.startswith(rest) for option in options):
        raise Undecided
    raise Mismatch


def partial_suffix(text: str, word: str) -> int:
    """The length of the longest end of `text` that `word` starts with (short of all of `word`)."""
    return next((k for k in range(min(len(word) - 1, len(text)), 0, -1) if text.endswith(word[:k])), 0)


def members(text: str) -> list[tuple[str, str]] | None:
    """Each member of a JSON object's text with its value's text as written; None if the text is not
    one JSON object."""
    try:
        if not isinstance(json.loads(text), dict):
            return None
        found, i = [], skip_ws(text, 1)
        while text[i] != "}":
            key, i = _DECODER.raw_decode(text, i)
            start = skip_ws(text, skip_ws(text, i) + 1)  # past the `:`
            _, i = _DECODER.raw_decode(text, start)
            found.append((key, text[start:i]))
            i = skip_ws(text, i)
            if text[i] == ",":
                i = skip_ws(text, i + 1)
    except (ValueError, RecursionError):
        return None
    return found
