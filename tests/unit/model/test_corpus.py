"""The synthetic corpus: deterministic, balanced, and styles told apart by their markers."""

import collections
import random

import pytest

from liveloop.model.corpus import STYLE_MARKERS, STYLES, TOPICS, generate_corpus, make_prompt, make_reply


def test_same_seed_same_corpus_and_other_seed_differs():
    assert generate_corpus(120, seed=3) == generate_corpus(120, seed=3)
    assert generate_corpus(120, seed=3) != generate_corpus(120, seed=4)


def test_topics_and_styles_balanced_and_independent():
    n = len(TOPICS) * len(STYLES) * 10
    counts = collections.Counter((ex.topic, ex.style) for ex in generate_corpus(n, seed=0))
    # every (topic, style) pair exactly 10 times: each topic gets every style
    assert set(counts) == {(t, s) for t in TOPICS for s in STYLES}
    assert set(counts.values()) == {10}


def test_uneven_size_is_balanced_within_one():
    corpus = generate_corpus(100, seed=1)
    assert len(corpus) == 100
    by_style = collections.Counter(ex.style for ex in corpus)
    by_topic = collections.Counter(ex.topic for ex in corpus)
    assert max(by_style.values()) - min(by_style.values()) <= 1
    assert max(by_topic.values()) - min(by_topic.values()) <= 2


def test_markers_present_in_own_style_absent_in_others():
    for ex in generate_corpus(1200, seed=0):
        text = ex.reply.lower()
        assert any(m in text for m in STYLE_MARKERS[ex.style]), ex
        for style, markers in STYLE_MARKERS.items():
            if style != ex.style:
                assert not [m for m in markers if m in text], ex


def test_markers_do_not_overlap():
    for a in STYLES:
        for b in STYLES:
            if a != b:
                assert not [(x, y) for x in STYLE_MARKERS[a] for y in STYLE_MARKERS[b] if x in y or y in x]


def test_reply_length_and_variety():
    corpus = generate_corpus(600, seed=0)
    assert all(15 <= len(ex.reply.split()) <= 45 for ex in corpus)
    assert len({ex.reply for ex in corpus}) > 0.95 * len(corpus)


def test_prompt_names_its_topic():
    rng = random.Random(0)
    for topic in TOPICS:
        for _ in range(5):
            assert topic in make_prompt(topic, rng).lower()


def test_unknown_style_or_topic_is_a_clear_error():
    with pytest.raises(ValueError, match="style"):
        make_reply("cats", "pirate", random.Random(0))
    with pytest.raises(ValueError, match="topic"):
        make_reply("volcanoes", "cute", random.Random(0))
