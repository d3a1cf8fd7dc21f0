"""Typed markers are text: of the special tokens a chat prompt's text spells (`<|user|>`, `<|end|>`,
`<|im_start|>`, ...), only the ones the chat template wrote become special-token ids; the same text typed
by a client or returned by a tool (a message's content, a tool result, call arguments, a name, a system
prompt, the Responses API's `instructions`, a tool's description or schema) is tokenized as plain text,
so nobody can forge a turn in the tokens the model sees, the store keeps and the learner trains on.

How (`Markers`, for any Hugging Face tokenizer and chat template):

1. Before rendering, every string of the conversation and the offered tools (values and keys, at any
   depth, after the call arguments are parsed as the template takes them) has each special token's text
   replaced by a per-request placeholder (`Masker`).
2. The template renders; each placeholder in its output is put back as the token's text and its span
   recorded (`PromptText.typed`). The text is exactly what rendering the conversation as it is gives.
3. Tokenizing (`Markers.ids`): a prompt with no typed span is tokenized whole; otherwise a piece that
   holds a typed marker is tokenized as plain text and the template's markers keep their ids. Should a
   tokenizer still give a special id for a typed marker, the request is refused (a 400), never served
   forged.

Special tokens only: an added token that is not special (Qwen's `<tool_call>`, `<think>`) is the model's
ordinary vocabulary, matched in client text as the tokenizer always matches it. The splice path
(server/edge/pipeline/splicing.py) carries the typed spans along (`PromptText.tail`) and refuses to
carry a forged turn (`Markers.forges`)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from liveloop.server.edge.formats.tools import ToolsRefused

Span = tuple[int, int]  # [start, end) characters of a text


@dataclass(frozen=True)
class PromptText:
    """A rendered prompt's text and where in it a client (or a tool) typed a special token's text."""

    text: str
    typed: tuple[Span, ...] = ()  # sorted, disjoint

    def head(self, end: int) -> PromptText:
        """The text before `end`, with its typed spans (one that `end` cuts keeps its part)."""
        return PromptText(self.text[:end], tuple((a, min(b, end)) for a, b in self.typed if a < end))

    def tail(self, start: int) -> PromptText:
        """The text from `start` on, with its typed spans (one that `start` cuts keeps its part)."""
        return PromptText(self.text[start:], tuple((max(a, start) - start, b - start) for a, b in self.typed if b > start))


def _overlapping(matches: Sequence[re.Match], typed: Sequence[Span]) -> list[bool]:
    """For each match (in order), whether it overlaps a typed span (both sorted)."""
    out, j = [], 0
    for m in matches:
        while j < len(typed) and typed[j][1] <= m.start():
            j += 1
        out.append(j < len(typed) and typed[j][0] < m.end())
    return out


class Masker:
    """One rendering's placeholders: `mask` the strings going into the template, `unmask` its output.

    A placeholder is a per-request random nonce plus the token's index, ASCII letters and digits only,
    so whatever the template does to client text (concatenation, `tojson`, `trim`) it does to the
    placeholder alike, and no client can spell or guess it. A template that cuts client text
    (`content[:n]`) may cut a placeholder: its characters then stay as text, which spells no marker."""

    def __init__(self, markers: Markers, nonce: str):
        self.markers, self.nonce = markers, nonce
        self.literals = markers.texts
        self.width = len(str(len(self.literals)))
        self._found = re.compile(re.escape(nonce) + r"(\d{%d})" % self.width)

    def mask(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.markers.pattern.sub(lambda m: f"{self.nonce}{self.markers.index[m.group()]:0{self.width}d}", value)
        if isinstance(value, dict):
            return {self.mask(k): self.mask(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.mask(v) for v in value)
        return value

    def unmask(self, rendered: str) -> PromptText:
        parts, typed, at, length = [], [], 0, 0
        for m in self._found.finditer(rendered):
            k = int(m.group(1))
            if k >= len(self.literals):
                continue
            parts.append(rendered[at : m.start()])
            length += m.start() - at
            typed.append((length, length + len(self.literals[k])))
            parts.append(self.literals[k])
            length += len(self.literals[k])
            at = m.end()
        parts.append(rendered[at:])
        return PromptText("".join(parts), tuple(typed))


class Markers:
    """A tokenizer's special tokens: which text spells them, and a prompt's ids with only the template's
    markers as special tokens."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        ids: dict[str, int] = {}
        for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(t, "special", False) and t.content:
                ids[t.content] = int(i)
        for s in getattr(tokenizer, "all_special_tokens", None) or ():
            i = tokenizer.convert_tokens_to_ids(s)
            if s and isinstance(i, int):
                ids.setdefault(s, i)
        self.id_of = ids
        # the ids a marker reads as: every special token's but the unknown one (a tokenizer gives it for
        # text it has no piece for; typed as `<unk>` it is still masked, and split)
        self.special_ids = frozenset(ids.values()) - {getattr(tokenizer, "unk_token_id", None)}
        self.texts = tuple(sorted(ids, key=lambda s: (-len(s), s)))  # longest first: leftmost-longest matching
        self.index = {s: k for k, s in enumerate(self.texts)}
        self.pattern = re.compile("|".join(re.escape(s) for s in self.texts)) if self.texts else None

    # -- rendering --------------------------------------------------------------------------------
    def masker(self, *values: Any, context: str = "") -> Masker | None:
        """The placeholders for one rendering of `values`; None when no string in them spells a special
        token (they render as they are). `context`: other text the nonce must not occur in (the template)."""
        if self.pattern is None:
            return None
        strings = list(_strings(values))
        if not any(self.pattern.search(s) for s in strings):
            return None
        while True:
            nonce = "M" + secrets.token_hex(8) + "k"
            if nonce not in context and not any(nonce in s for s in strings) and not self.pattern.search(nonce):
                return Masker(self, nonce)

    # -- tokenizing -------------------------------------------------------------------------------
    def whole(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def plain(self, text: str) -> list[int]:
        """`text`'s ids with every special token's text split (plain text); raises ToolsRefused where the
        tokenizer still gives a special id."""
        if not text:
            return []
        ids = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if any(t in self.special_ids for t in ids):
            raise ToolsRefused(
                "messages: the text holds the model's control tokens (such as "
                f"`{next(s for s in self.texts if s in text)}`), which this tokenizer cannot take as text", "messages")
        return ids

    def ids(self, prompt: PromptText | str) -> list[int]:
        """The prompt's token ids: the template's markers as special tokens, typed ones as text.

        A prompt with no typed span is tokenized whole, as before, so a benign conversation's ids are
        byte-identical to the old ones (the splice of earlier turns and the episode links by exact
        token prefix depend on it). Otherwise the text is cut at the template's own markers (every
        special token's text that overlaps no typed span); a piece between two of them that holds a
        typed one is tokenized with `split_special_tokens=True` (plain text); every other piece keeps
        the ids the whole tokenization gave it, the markers their own id.

        Where the tokenizer's matching of special tokens is not this module's (their counts or ids
        disagree: a token that strips whitespace or matches after normalization), every piece is
        tokenized on its own, the template's markers still their ids. A tokenizer that treats the start
        of a text apart (SentencePiece's `▁` before a text's first piece, Metaspace
        `prepend_scheme="first"`) gives a re-tokenized piece that `▁` where the whole text has none:
        still no forged id, but such a prompt's ids decode one space longer there, so the next turn is
        tokenized whole rather than spliced. Byte-level BPE (Qwen, Llama 3, the tiny model: the
        tool-calling families served) has no such start, and its ids decode back to the text exactly."""
        if isinstance(prompt, str):
            prompt = PromptText(prompt)
        text = prompt.text
        whole = self.whole(text)
        if not prompt.typed or self.pattern is None:
            return whole
        matches = list(self.pattern.finditer(text))
        typed = _overlapping(matches, prompt.typed)
        if not any(typed):
            return whole
        at = [k for k, t in enumerate(whole) if t in self.special_ids]  # where the whole tokenization put them
        aligned = len(at) == len(matches) and all(whole[k] == self.id_of[m.group()] for k, m in zip(at, matches))
        out: list[int] = []
        tok, char, dirty = 0, 0, False  # the piece since the last template marker: first id, first char, holds a typed one
        for k, m in enumerate(matches + [None]):
            if m is not None and typed[k]:
                dirty = True
                continue
            end_tok, end_char = (len(whole), len(text)) if m is None else (at[k] if aligned else 0, m.start())
            out += whole[tok:end_tok] if aligned and not dirty else self.plain(text[char:end_char])
            if m is not None:
                out.append(self.id_of[m.group()])
                tok, char, dirty = end_tok + 1, m.end(), False
        return out

    def template_markers(self, prompt: PromptText) -> int:
        """How many special tokens' texts in `prompt` the template wrote (overlap no typed span)."""
        if self.pattern is None:
            return 0
        matches = list(self.pattern.finditer(prompt.text))
        return len(matches) - sum(_overlapping(matches, prompt.typed))

    def forges(self, ids: Sequence[int], prompt: PromptText) -> bool:
        """Whether `ids`, tokens whose text is `prompt`'s, hold a special id where the text's marker was
        typed: more special ids than the template wrote (ids tokenized here never do). The splice path
        tokenizes the rest of a prompt after an earlier turn's carried tokens with the typed spans
        shifted with it (`PromptText.tail`), and carries no turn that forges (one stored before typed
        markers were text): the prompt is then tokenized here, whole."""
        if not prompt.typed:
            return False
        return sum(1 for t in ids if int(t) in self.special_ids) > self.template_markers(prompt)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
