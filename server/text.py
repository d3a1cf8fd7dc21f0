"""Token ids -> text for the HTTP edge: incremental detokenization that never emits half a UTF-8
character, stop strings (with hold-back so a stream never shows part of a stop string), and the
per-token strings/bytes the OpenAI logprobs format needs."""

from __future__ import annotations

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


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far, cut at a stop string
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def add(self, token_ids: list[int]) -> str:
        """Feed new tokens; returns the text that is now safe to emit."""
        if self.stopped:
            return ""
        self.ids.extend(token_ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.stop:
            idx = full.find(s, max(0, self.emitted - len(s)))
            if idx != -1:
                full = full[:idx]
                self.stopped = True
        self.text = full
        if self.stopped:
            return self._emit(len(full))
        safe = len(full)
        while safe > 0 and full[safe - 1] == "\ufffd":  # an incomplete multi-byte character
            safe -= 1
        return self._emit(max(self.emitted, safe - self.holdback))

    def finish(self) -> str:
        """The generation ended: emit what was held back."""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
