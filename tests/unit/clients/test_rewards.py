"""The rule rewards and default prompts that `liveloop critic pretrain` rates its rollouts with."""

from __future__ import annotations

import random

import pytest

from liveloop.clients.rewards import SIX_OBJECTIVES, corpus_prompt, make_reward
from liveloop.model.corpus import TOPICS


def test_rewards():
    assert make_reward("contains:Behold")("Behold! the sea") == 1.0
    assert make_reward("style:classical")("Verily, 'tis rain") == 1.0
    assert make_reward("style:cute")("Verily, 'tis rain") == 0.0
    assert make_reward("max_words:3")("the quiet sea") == 1.0
    assert make_reward("max_words:3")("the sea is quiet") == 0.0
    assert make_reward("max_words:3")("") == 0.0  # an empty reply is no answer
    for bad in ("sentiment", "max_words:0", "max_words:x"):
        with pytest.raises(ValueError, match="contains:WORD"):
            make_reward(bad)


def test_corpus_prompts_take_the_topics_in_turn():
    rng = random.Random(0)
    prompts = [corpus_prompt(i, rng) for i in range(len(TOPICS) + 1)]
    assert all(TOPICS[i % len(TOPICS)] in p for i, p in enumerate(prompts))


def test_six_objectives_are_one_of_each_kind():
    kinds = [spec.partition(":")[0] for spec in SIX_OBJECTIVES]
    assert kinds == ["contains", "style", "max_words", "max_sentences", "tone", "avoid"]
    assert all(callable(make_reward(spec)) for spec in SIX_OBJECTIVES)
