"""Rule rewards (reply text -> 0/1) and the default prompts, for rating in-process rollouts of the
default model (`liveloop critic pretrain`): what a simulated user of the default corpus asks and how it
rates. `contains:WORD` (the reply contains WORD, case-insensitive), `style:NAME` (the reply uses a
marker of that writing style from the default model's corpus) and `max_words:N` (a format: the reply
has at most N words; the corpus never asks for brevity)."""

from __future__ import annotations

import random
from collections.abc import Callable

from liveloop.model.corpus import STYLE_MARKERS, TOPICS, make_prompt


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


def corpus_prompt(i: int, rng: random.Random) -> str:
    """The i-th default prompt: the corpus' topics in turn, each phrased at random."""
    return make_prompt(TOPICS[i % len(TOPICS)], rng)
