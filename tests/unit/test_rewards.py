"""The rule kinds of liveloop/rewards.py beyond a word, a style and a word count: sentences (as the
default corpus writes them), tone by punctuation, and a word left out. Hand-made replies."""

from __future__ import annotations

import pytest

from liveloop.rewards import make_reward, sentences


@pytest.mark.parametrize(("text", "count"), [
    ("Kukuku... The abyss awaits.", 2),  # an ellipsis before a capital ends a sentence
    ("The loaf rises in the oven... a sign that my sealed eye is awakening!", 1),  # before lowercase: not
    ("Hehe~ Look at the shore, it is so fluffy and sweet ♡ A tiny wave sparkles at noon~", 3),
    ("Verily, the moon doth glow over the hills.", 1),
    ("'Tis true: 'Tis a pale moon.", 1),
    ("Hark! 'Tis a pale moon.", 2),
    ("Kukuku, the sea? The shore is mine.", 2),
    ("Wow!! Really?! Yes.", 3),
    ("Behold! The train rolls past the", 2),  # an unfinished last sentence counts
    ("  Aww~  ", 1),
    ("Uwu ♡", 1),
    ("♡ ~", 0),
    ("", 0),
])
def test_sentences(text, count):
    assert len(sentences(text)) == count


def test_max_sentences():
    at_most_two = make_reward("max_sentences:2")
    assert at_most_two("Kukuku... The abyss awaits.") == 1.0
    assert at_most_two("Behold! The abyss awaits. Such is fate.") == 0.0
    assert at_most_two("The train rolls past... a sign that fate stirs. Such is fate.") == 1.0
    assert at_most_two("") == 0.0  # an empty reply is no answer
    assert make_reward("max_sentences:1")("Hehe~ So cute~") == 0.0


def test_tones():
    excited, calm = make_reward("tone:excited"), make_reward("tone:calm")
    assert excited("Behold! Tremble, mortals!") == 1.0
    assert excited("Hehe!! So cute.") == 1.0
    assert excited("Behold! The sea is mine.") == 0.0
    assert excited("!!") == 0.0  # no words, no answer
    assert calm("Verily, the moon doth glow~") == 1.0  # "~" is the cute style, not excitement
    assert calm("Hark! The moon doth glow.") == 0.0
    assert calm("") == 0.0
    assert excited("Behold!") == calm("Behold!") == 0.0  # one "!" is neither


def test_avoid():
    no_and = make_reward("avoid:And")
    assert no_and("The sand is warm and soft.") == 0.0
    assert no_and("The sand is warm.") == 1.0  # whole words: "sand" does not say "and"
    assert no_and("AND so it is") == 0.0
    assert no_and("") == 0.0 and no_and("~ ♡") == 0.0  # saying nothing is not leaving a word out
    phrase = make_reward("avoid:dark power")
    assert phrase("My sealed dark power stirs.") == 0.0
    assert phrase("Dark, power!") == 0.0  # punctuation between the words does not hide them
    assert phrase("The power of the dark.") == 1.0
    assert make_reward("avoid:you're")("You're kind.") == 0.0


@pytest.mark.parametrize("bad", [
    "max_sentences:0", "max_sentences:x", "max_sentences:", "max_sentences:-1", "max_sentences:2.5",
    "tone:angry", "tone:", "tone:Calm", "avoid:", "avoid:!!", "avoid", "refuse:and",
])
def test_malformed_specs_name_the_accepted_forms(bad):
    with pytest.raises(ValueError, match=r"max_sentences:N, tone:excited\|calm or avoid:WORD"):
        make_reward(bad)
