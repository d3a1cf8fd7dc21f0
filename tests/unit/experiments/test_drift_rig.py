"""The drift rig's pure pieces: the users' arrivals and the reward per phase (hand-computed)."""

from __future__ import annotations

import itertools
from collections import Counter

from liveloop.experiments.drift import load_experiment
from liveloop.experiments.drift_rig import Rating, arrivals, phase_means


def _rating(segment, phase, reward):
    return Rating(0, segment, phase, "cute", None, reward, "g", None, 0, 0.0)


def test_phase_means_over_every_rating_of_a_phase():
    ratings = [_rating("a", 0, 1), _rating("a", 0, 0), _rating("a", 1, 1), _rating("b", 0, 0),
               _rating("a", 0, 1), _rating("b", 1, 1)]
    # a/phase0: 1, 0, 1 -> 2/3; a/phase1: 1; b/phase0: 0; b/phase1: 1
    assert phase_means(ratings) == {"a/phase0": 2 / 3, "a/phase1": 1.0, "b/phase0": 0.0, "b/phase1": 1.0}


def test_arrivals_come_from_their_segments_topics_and_repeat_with_the_seed():
    sc = load_experiment("drift_long").scenario
    first = list(itertools.islice(arrivals(sc, 7), 400))
    assert [(a.segment.name, a.prompt) for a in first] == [(a.segment.name, a.prompt) for a in itertools.islice(arrivals(sc, 7), 400)]
    assert [a.prompt for a in first] != [a.prompt for a in itertools.islice(arrivals(sc, 8), 400)]
    assert all(a.topic in a.segment.topics and a.topic in a.prompt.lower() for a in first)
    counts = Counter(a.segment.name for a in first)
    # equal weights: each segment's share of 400 within 4 standard deviations (sd = sqrt(400 / 4) = 10)
    assert set(counts) == {"cozy", "night"} and all(abs(n - 200) < 40 for n in counts.values())
