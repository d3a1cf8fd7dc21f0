"""Rule rewards (reply text -> 0/1) and the default prompts, for rating in-process rollouts of the
default model (`liveloop critic pretrain`): what a simulated user of the default corpus asks and how it
rates. `contains:WORD` (the reply contains WORD, case-insensitive), `style:NAME` (the reply uses a
marker of that writing style from the default model's corpus), `max_words:N` (a format: the reply has
at most N words; the corpus never asks for brevity), `max_sentences:N` (a structure: 1 to N sentences),
`tone:excited|calm` (at least two "!" / none) and `avoid:WORD` (the reply never says WORD: a negative
constraint, the stand-in for a refusal pattern, which the corpus holds none of). The rules live in
liveloop/rewards.py (the release gate's evaluation scores by the same ones); this module re-exports
them, with `SIX_OBJECTIVES`: one rule of each kind, parameters chosen by their base rates."""

from __future__ import annotations

import random

from liveloop.model.corpus import TOPICS, make_prompt
from liveloop.rewards import make_reward

__all__ = ["SIX_OBJECTIVES", "corpus_prompt", "make_reward"]

# One objective of each kind the issue asks for, with its base rate on the default model
# (bench/objective_base_rates.py: 200 replies to the default prompts, max_tokens 48, temperature 1;
# docs/results/data/objective_base_rates.json), each between 0.02 and 0.5 so that "base rate + 0.25" is
# reachable and the learner sees some positives from the start:
SIX_OBJECTIVES: tuple[str, ...] = (
    "contains:behold",  # a word: 0.165
    "style:classical",  # a style: 0.335
    "max_words:16",  # a format, length: 0.065 (max_words:12 is 0.010, 14 is 0.025, 18 is 0.175)
    "max_sentences:2",  # a format, structure: 0.180 (1 sentence 0.010, 3 sentences 0.660)
    "tone:excited",  # a tone, at least two "!": 0.125 (tone:calm, no "!", 0.410)
    "avoid:and",  # a refusal pattern's stand-in, a word left out: 0.455 (avoid:the 0.015)
)


def corpus_prompt(i: int, rng: random.Random) -> str:
    """The i-th default prompt: the corpus' topics in turn, each phrased at random."""
    return make_prompt(TOPICS[i % len(TOPICS)], rng)
