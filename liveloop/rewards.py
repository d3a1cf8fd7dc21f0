"""Rule rewards (reply text -> 0/1) and the repetition rule: what the simulated users' judges
(clients/) and the release gate's evaluation checks (release/checks.py) both score replies by, so the
two cannot drift apart. Imports no component.

- `make_reward(spec)`: `contains:WORD` (the reply contains WORD, case-insensitive), `style:NAME` (the
  reply uses a marker of that writing style from the default model's corpus) and `max_words:N` (a
  format: the reply has at most N words; the corpus never asks for brevity).
- `words(text)` and `repetitive(words, ...)`: a reply loops when one 3-word sequence occurs more than
  `max_ngram_repeats` times or its distinct words are under `min_distinct_ratio` of its words
  (clients/judge.py's QualityGate and the evaluation's `repetition` check)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

from liveloop.model.corpus import STYLE_MARKERS

MAX_NGRAM_REPEATS = 3  # the same 3-word sequence at most this many times
MIN_DISTINCT_RATIO = 0.35  # distinct words / words


def make_reward(spec: str) -> Callable[[str], float]:
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
    raise ValueError(f"reward {spec!r}: expected contains:WORD, style:{'|'.join(STYLE_MARKERS)} or max_words:N")


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
