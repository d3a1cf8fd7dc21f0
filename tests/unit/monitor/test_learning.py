"""The learning view (monitor/learning.py) on hand-made replies, every figure computed by hand, and
`[monitor] behaviours` checked at config load."""

from __future__ import annotations

import pytest

from liveloop.config import ConfigError, load_config
from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.learning import Reply, moving_reward, segment_learning
from liveloop.segments import BASE as BASE_LINEAGE
from liveloop.segments import Lineage

BEHAVIOURS = ("contains:behold", "max_words:3")
# newest first, as the store reads them; ratings are (feedback id, reward)
REPLIES = [
    Reply(1, "behold the stars", ((5, 1),)),
    Reply(1, "a quiet night here", ((4, 0),)),
    Reply(0, "hello there", ((1, 0), (2, 1))),  # two keys rated it
    Reply(0, "behold, friend", ()),
    Reply(0, "nice tea today ok", ((3, 0),)),
]


def test_per_version_counts_reward_and_behaviour_rates():
    view = segment_learning(Lineage("cozy"), REPLIES, BEHAVIOURS, window=2)
    assert (view.segment, view.window, view.responses, view.ratings) == ("cozy", 2, 5, 5)
    v0, v1 = view.versions
    assert (v0.version, v0.responses, v0.reward.n, v0.reward.successes) == (0, 3, 3, 1)
    assert (v1.version, v1.responses, v1.reward.n, v1.reward.successes) == (1, 2, 2, 1)
    # v0: "behold, friend" says behold (1 of 3); "hello there" and "behold, friend" have <= 3 words (2 of 3)
    assert [(b.behaviour, b.served.successes, b.served.n) for b in v0.behaviours] == [("contains:behold", 1, 3), ("max_words:3", 2, 3)]
    # v1: "behold the stars" does both (3 words); "a quiet night here" neither
    assert [(b.behaviour, b.served.successes, b.served.n) for b in v1.behaviours] == [("contains:behold", 1, 2), ("max_words:3", 1, 2)]
    # Wilson 95% for 1 of 3, by hand: centre 0.4269, half-width 0.3654
    assert v0.reward.low == pytest.approx(0.0615, abs=1e-4) and v0.reward.high == pytest.approx(0.7923, abs=1e-4)


def test_moving_reward_follows_arrival_order_over_the_window():
    view = segment_learning(Lineage("cozy"), REPLIES, (), window=2)
    # arrivals by feedback id: 1 (v0 down), 2 (v0 up), 3 (v0 down), 4 (v1 down), 5 (v1 up)
    assert [(p.index, p.version, p.reward) for p in view.moving] == [(1, 0, 0.0), (2, 0, 0.5), (3, 0, 0.5), (4, 1, 0.0), (5, 1, 0.5)]
    wide = segment_learning(Lineage("cozy"), REPLIES, (), window=50)  # fewer ratings than the window: the mean so far
    assert [p.reward for p in wide.moving] == pytest.approx([0.0, 0.5, 1 / 3, 0.25, 0.4])
    assert view.versions[0].behaviours == ()


def test_base_segment_and_nothing_served():
    view = segment_learning(BASE_LINEAGE, [], BEHAVIOURS)
    assert (view.segment, view.responses, view.ratings, view.versions, view.moving) == ("base", 0, 0, (), ())


def test_moving_reward_needs_a_window():
    assert moving_reward([(0, 1), (0, 0), (0, 0)], 1) == [(1, 1.0), (2, 0.0), (3, 0.0)]
    with pytest.raises(ValueError, match="window"):
        moving_reward([], 0)


def test_behaviours_are_checked_at_config_load():
    assert MonitorConfig().behaviours == ()
    config = load_config(text='[monitor]\nbehaviours = ["contains:behold", "style:classical", "max_words:12"]\n')
    assert config.monitor.behaviours == ("contains:behold", "style:classical", "max_words:12")
    with pytest.raises(ConfigError, match=r"monitor: behaviours: 'stlye:classical' is not a rule"):
        load_config(text='[monitor]\nbehaviours = ["contains:behold", "stlye:classical"]\n')
