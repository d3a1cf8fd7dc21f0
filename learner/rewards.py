"""Configured reward functions (text -> 0/1) for critic pre-training and synthetic feedback:
`contains:WORD` (the reply contains WORD, case-insensitive) and `style:NAME` (the reply uses a marker
of that writing style from the default model's corpus)."""

from __future__ import annotations

from collections.abc import Callable

from liveloop.model.corpus import STYLE_MARKERS


def make_reward(spec: str) -> Callable[[str], float]:
    kind, _, arg = spec.partition(":")
    if kind == "contains" and arg:
        word = arg.lower()
        return lambda text: float(word in text.lower())
    if kind == "style" and arg in STYLE_MARKERS:
        markers = STYLE_MARKERS[arg]
        return lambda text: float(any(m in text.lower() for m in markers))
    raise ValueError(f"reward {spec!r}: expected contains:WORD or style:{'|'.join(STYLE_MARKERS)}")
