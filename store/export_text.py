"""Text back from the token ids the store keeps, for the export's trainer shapes (`store/export.py`).

The store keeps what the engine saw and sampled (token ids), not the request's text: a chat prompt is
stored as its chat-templated tokens. `TokenText` decodes them with the served model's own tokenizer
(`tokenizer.json`, through the `tokenizers` library: no torch, no transformers) and reads a chat prompt
back into its messages by inverting the model's chat template: each role's prefix and suffix come from
rendering the template around a marker, and the messages read back count only when rendering them again
(with the generation prompt, as the server does) gives the decoded prompt exactly. So a prompt the
template does not invert (a /v1/completions prompt, a template with dates or tools) is never guessed:
`messages` answers None and the caller chooses (the text form, or leaving the row out).

Markers typed as text never become turns. A tokenizer reads its added tokens (`<|user|>`, `<|end|>`,
...: the special tokens and the chat template's role markers) out of any text it is given, so a user
message holding "<|end|>\n<|assistant|>\n..." would read back, to a trainer that templates and tokenizes
it, as a forged assistant turn. So the text this module gives is rendered with special tokens split: a
special token's id reads as its marker, while a marker spelt by ordinary tokens (text someone typed) is
escaped, `escape`: a zero-width space (ESCAPE) after its first character, so it reads the same and
tokenizes as plain text. The escape is injective (a marker already followed by escapes gets one more),
so `plain_markers` counts exactly the markers ordinary tokens spelt, and text with no markers is
unchanged. Added tokens of one character cannot be split and are not escaped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
_MARK = "\x00LIVELOOP-MARK\x00"
CACHE = 4096  # prompts whose messages are remembered
ESCAPE = "\u200b"  # after a typed marker's first character: it reads the same and tokenizes as plain text


class NoTokenizer(ValueError):
    """The model directory has no tokenizer this module reads (tokenizer.json)."""


class TokenText:
    _added: dict[int, str] = {}  # the tokenizer's added tokens (id -> marker); none: nothing to escape
    _markers: re.Pattern[str] | None = None

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise NoTokenizer(f"--model: {model_dir} has no tokenizer.json (the served model's directory is needed to decode token ids)")
        self._tok = Tokenizer.from_file(str(path))
        self._added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        self._markers = _marker_pattern(self._added.values())
        config = _read_json(model_dir / "tokenizer_config.json")
        self.eos_token: str | None = _token_text(config.get("eos_token"))
        template = config.get("chat_template")
        if (model_dir / "chat_template.jinja").is_file():
            template = (model_dir / "chat_template.jinja").read_text()
        self._template = _compile(template) if isinstance(template, str) else None
        self._roles = self._role_marks() if self._template is not None else {}
        self._cache: dict[str, list[dict[str, str]] | None] = {}

    def text(self, ids: Sequence[int]) -> str:
        """The text of token ids with special tokens split: an added token's id reads as its marker,
        the ordinary tokens between them as their text with any marker they spell escaped."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if self._added.keys().isdisjoint(ids):
            return self.escape(self._decode(ids))
        out, run = [], []
        for i in ids:
            if i in self._added:
                out += [self.escape(self._decode(run)), self._added[i]]
                run = []
            else:
                run.append(i)
        out.append(self.escape(self._decode(run)))
        return "".join(out)

    def escape(self, text: str) -> str:
        """`text` with every marker in it (an added token's text, escaped already or not) given one more
        ESCAPE after its first character: it no longer tokenizes as the token."""
        if self._markers is None or not text:
            return text
        return self._markers.sub(lambda m: m[0][0] + ESCAPE + m[0][1:], text)

    def markers(self, text: str) -> int:
        """How many markers `text` holds as they are (each tokenizes as its added token)."""
        return self._count(text, 0)

    def plain_markers(self, text: str) -> int:
        """How many markers `escape` escaped in `text` (once: each was a marker as typed)."""
        return self._count(text, 1)

    def _count(self, text: str, escapes: int) -> int:
        if self._markers is None or not text:
            return 0
        return sum(1 for m in self._markers.finditer(text) if len(m[0]) - len(m[0][0] + m[0][1:].lstrip(ESCAPE)) == escapes)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False) if ids else ""

    def completion(self, ids: Sequence[int]) -> str:
        """A reply's text without its end-of-sequence token (the chat template adds it back)."""
        text = self.text(ids)
        if self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text

    def messages(self, prompt: str) -> list[dict[str, str]] | None:
        """The chat messages whose templated form (with the generation prompt) is exactly `prompt`; None
        when the template does not invert to it. The last CACHE prompts' answers are remembered (many
        ratings share a prompt); callers must not change the lists."""
        if prompt in self._cache:
            return self._cache[prompt]
        out = self._messages(prompt)
        if len(self._cache) >= CACHE:
            self._cache.pop(next(iter(self._cache)))
        self._cache[prompt] = out
        return out

    def _messages(self, prompt: str) -> list[dict[str, str]] | None:
        if self._template is None or not self._roles:
            return None
        head, gen = self._empty, self._generation_prompt
        if not prompt.startswith(head) or not prompt.endswith(gen):
            return None
        body, at, out = prompt[: len(prompt) - len(gen)], len(head), []
        while at < len(body):
            for role, (prefix, suffix) in self._roles.items():
                if prefix and body.startswith(prefix, at):
                    end = body.find(suffix, at + len(prefix)) if suffix else len(body)
                    if end < 0:
                        continue
                    out.append({"role": role, "content": body[at + len(prefix) : end]})
                    at = end + len(suffix)
                    break
            else:
                return None
        if not out:
            return None
        try:
            again = self._render(out, True)
        except Exception:  # noqa: BLE001 - a template that refuses these messages does not invert
            return None
        return out if again == prompt else None

    # -- the template's shape -------------------------------------------------------------------
    def _render(self, messages: list[dict[str, str]], generation: bool) -> str:
        assert self._template is not None
        return self._template.render(messages=messages, add_generation_prompt=generation, bos_token="", eos_token=self.eos_token or "")

    def _role_marks(self) -> dict[str, tuple[str, str]]:
        marks: dict[str, tuple[str, str]] = {}
        try:
            empty = self._empty = self._render([], False)
            self._generation_prompt = self._render([], True)[len(empty):] if self._render([], True).startswith(empty) else ""
            for role in ROLES:
                whole = self._render([{"role": role, "content": _MARK}], False)
                if whole.count(_MARK) != 1 or not whole.startswith(empty):
                    continue
                prefix, suffix = whole[len(empty):].split(_MARK)
                marks[role] = (prefix, suffix)
        except Exception:  # noqa: BLE001 - any template error: no inversion, text form only
            return {}
        return marks


def _compile(template: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, **kw: json.dumps(value, **kw)
    return env.from_string(template)


def _marker_pattern(markers: Iterable[str]) -> re.Pattern[str] | None:
    """Every marker (of two characters or more), matched with any escapes after its first character;
    the longest first where one begins another."""
    marks = sorted({m for m in markers if len(m) > 1}, key=len, reverse=True)
    if not marks:
        return None
    return re.compile("|".join(re.escape(m[0]) + ESCAPE + "*" + re.escape(m[1:]) for m in marks))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
