"""The rule rewards and default prompts that `liveloop critic pretrain` rates its rollouts with."""

from __future__ import annotations

import random

import pytest

from liveloop.clients.rewards import corpus_prompt, make_reward
from liveloop.model.corpus import TOPICS


def test_rewards():
    assert make_reward("contains:Behold")("Behold! the sea") == 1.0
    assert make_reward("style:classical")("Verily, 'tis rain") == 1.0
    assert make_reward("style:cute")("Verily, 'tis rain") == 0.0
    with pytest.raises(ValueError, match="contains:WORD"):
        make_reward("sentiment")


def test_corpus_prompts_take_the_topics_in_turn():
    rng = random.Random(0)
    prompts = [corpus_prompt(i, rng) for i in range(len(TOPICS) + 1)]
    assert all(TOPICS[i % len(TOPICS)] in p for i, p in enumerate(prompts))
