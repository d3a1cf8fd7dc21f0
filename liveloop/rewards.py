"""Rule rewards (reply text -> 0/1) and the repetition rule: what the simulated users' judges
(clients/) and the release gate's evaluation checks (release/checks.py) both score replies by, so the
two cannot drift apart. Imports no component.

- `make_reward(spec)`: `contains:WORD` (the reply contains WORD, case-insensitive), `style:NAME` (the
  reply uses a marker of that writing style from the default model's corpus) and `max_words:N` (a
  format: the reply has at most N words; the corpus never asks for brevity); and
  - `max_sentences:N` (a structure: the reply has 1 to N sentences, `sentences(text)`);
  - `tone:excited` (at least two "!") and `tone:calm` (no "!"): a tone by punctuation, not a style in
    disguise: every style of the corpus has templates with and without "!" ("~" is a marker of the cute
    style, so calm does not forbid it);
  - `avoid:WORD` (the reply never says the word or word sequence WORD, case-insensitive, whole words;
    `avoid:and` is not broken by "sand"). It stands in for a refusal pattern: the default model's
    corpus holds no refusals, so a tiny model trained on it cannot learn to decline; the nearest
    learnable behaviour is a negative constraint, leaving something out.
  Every rule but `contains` and `style` scores an empty reply 0: saying nothing is no answer.
- `words(text)` and `repetitive(words, ...)`: a reply loops when one 3-word sequence occurs more than
  `max_ngram_repeats` times or its distinct words are under `min_distinct_ratio` of its words
  (clients/judge.py's QualityGate and the evaluation's `repetition` check)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

MAX_NGRAM_REPEATS = 3  # the same 3-word sequence at most this many times
MIN_DISTINCT_RATIO = 0.35  # distinct words / words


TONES = ("excited", "calm")
RULE_SPECS = f"contains:WORD, style:NAME, max_words:N, max_sentences:N, tone:{'|'.join(TONES)} or avoid:WORD"  # for help texts

# A sentence ends at ".", "!", "?", "~" or "♡" (the cute style ends sentences with the last two, "Hehe~
# Look at ...") followed by whitespace and then anything but a lowercase letter: "Kukuku... The abyss"
# is two sentences, "the train rolls past... a sign" one.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?~♡])\s+(?=[^a-z])")


def make_reward(spec: str) -> Callable[[str], float]:
    # imported here: the config help texts import RULE_SPECS, and the learner must not import the demo corpus
    from liveloop.model.corpus import STYLE_MARKERS

    kind, _, arg = spec.partition(":")
    if kind == "contains" and arg:
        word = arg.lower()
        return lambda text: float(word in text.lower())
    if kind == "style" and arg in STYLE_MARKERS:
        markers = STYLE_MARKERS[arg]
        return lambda text: float(any(m in text.lower() for m in markers))
    if kind == "max_words" and arg.isdigit() and int(arg) > 0:
        limit = int(arg)
        return lambda text: float(0 < len(text.split()) <= limit)
    if kind == "max_sentences" and arg.isdecimal() and int(arg) > 0:
        most = int(arg)
        return lambda text: float(0 < len(sentences(text)) <= most)
    if kind == "tone" and arg == "excited":
        return lambda text: float(bool(words(text)) and text.count("!") >= 2)
    if kind == "tone" and arg == "calm":
        return lambda text: float(bool(words(text)) and "!" not in text)
    if kind == "avoid" and words(arg):
        banned = tuple(words(arg))
        return lambda text: float(bool(words(text)) and not _says(words(text), banned))
    raise ValueError(
        f"reward {spec!r}: expected {RULE_SPECS.replace('NAME', '|'.join(STYLE_MARKERS))} (N a whole number above 0)"
    )


def sentences(text: str) -> list[str]:
    """The reply's sentences, as the corpus writes them (see `_SENTENCE_BREAK`); a piece without a
    letter or digit ("♡") is none, an unfinished last one counts."""
    return [s for s in _SENTENCE_BREAK.split(text.strip()) if re.search(r"\w", s)]


def _says(tokens: Sequence[str], phrase: tuple[str, ...]) -> bool:
    n = len(phrase)
    return any(tuple(tokens[i : i + n]) == phrase for i in range(len(tokens) - n + 1))


def words(text: str) -> list[str]:
    """The reply's words, lowercased (apostrophes kept: "you're")."""
    return re.findall(r"[\w']+", text.lower())


def repetitive(
    tokens: Sequence[str], max_ngram_repeats: int = MAX_NGRAM_REPEATS, min_distinct_ratio: float = MIN_DISTINCT_RATIO
) -> bool:
    """Whether a reply (its words) loops: a 3-word sequence more than `max_ngram_repeats` times, or
    fewer distinct words than `min_distinct_ratio` of them. An empty reply does not loop."""
    if not tokens:
        return False
    trigrams = Counter(zip(tokens, tokens[1:], tokens[2:]))
    if trigrams and max(trigrams.values()) > max_ngram_repeats:
        return True
    return len(set(tokens)) / len(tokens) < min_distinct_ratio
