"""Rule rewards (reply text -> 0/1) and the default prompts, for rating in-process rollouts of the
default model (`liveloop critic pretrain`): what a simulated user of the default corpus asks and how it
rates. `contains:WORD` (the reply contains WORD, case-insensitive), `style:NAME` (the reply uses a
marker of that writing style from the default model's corpus) and `max_words:N` (a format: the reply
has at most N words; the corpus never asks for brevity). The rules live in liveloop/rewards.py (the
release gate's evaluation scores by the same ones); this module re-exports them."""

from __future__ import annotations

import random

from liveloop.model.corpus import TOPICS, make_prompt
from liveloop.rewards import make_reward

__all__ = ["corpus_prompt", "make_reward"]


def corpus_prompt(i: int, rng: random.Random) -> str:
    """The i-th default prompt: the corpus' topics in turn, each phrased at random."""
    return make_prompt(TOPICS[i % len(TOPICS)], rng)
