"""Token ids -> text for the HTTP edge: incremental detokenization that never emits half a UTF-8
character, stop strings (with hold-back so a stream never shows part of a stop string), and the
per-token strings/bytes the OpenAI logprobs format needs."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    # GPT-2 byte-level alphabet: printable stand-ins for the 256 byte values.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The raw bytes a token stands for (byte-level BPE), or its decoded text's UTF-8 otherwise."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    dec = _byte_decoder()
    if piece is not None and all(ch in dec for ch in piece):
        return bytes(dec[ch] for ch in piece)
    return tokenizer.decode([token_id]).encode("utf-8")


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """ids -> text without special tokens. A fast tokenizer that does no clean-up of spaces decodes
    straight through its Rust backend (the same text; the Python wrapper costs more than the decode)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class TextStream:
    """Incremental detokenization: each `add` decodes only a short window, the tokens since the last
    settled character boundary (plus the ones before it, so a decoder that treats a sequence's start
    specially sees the same context), never the whole response again. A window whose text ends in an
    incomplete UTF-8 character waits for the next tokens."""

    def __init__(self, tokenizer: Any, stop: list[str] | None = None):
        self.decode = _decoder(tokenizer)
        self.stop = [s for s in (stop or []) if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far, cut at a stop string
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False
        self.stop_sequence: str | None = None  # the stop string the text was cut at
        self._prefix = 0  # ids[_prefix:_read] decode to the context the next window is read after
        self._read = 0  # ids before this are in self.text

    def add(self, token_ids: list[int]) -> str:
        """Feed new tokens; returns the text that is now safe to emit."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        if self._settle(final=False):
            self._cut_at_stop()
        if self.stopped:
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self.holdback)

    def finish(self) -> str:
        """The generation ended: emit what was held back (an incomplete character as U+FFFD)."""
        if not self.stopped and self._settle(final=True):
            self._cut_at_stop()
        return self._emit(len(self.text))

    def _settle(self, final: bool) -> bool:
        """Move the decoded tokens' text into self.text; returns whether it grew."""
        if self._read == len(self.ids):
            return False
        context = self.decode(self.ids[self._prefix : self._read]) if self._read > self._prefix else ""
        window = self.decode(self.ids[self._prefix :])
        if len(window) <= len(context) or (window.endswith("\ufffd") and not final):
            return False  # nothing new yet, or half a character: wait for the rest of its bytes
        self.text += window[len(context) :]
        self._prefix, self._read = self._read, len(self.ids)
        return True

    def _cut_at_stop(self) -> None:
        for s in self.stop:
            idx = self.text.find(s, max(0, self.emitted - len(s)))
            if idx != -1:
                self.text = self.text[:idx]
                self.stopped = True
                self.stop_sequence = s  # a later stop found in the shortened text cut earlier: it wins

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
