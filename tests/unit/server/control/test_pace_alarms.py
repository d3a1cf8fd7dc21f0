"""The learner's alarms as state with time passed in (server/control/pace_alarms.py): a falling-behind
episode is reported once when it starts and once when it ends, and again for a new one; a paused lane
is not judged; refused steps are counted at every look and reported at most once a minute per lane,
with how many there were."""

from __future__ import annotations

from liveloop.server.control.pace import Pace, WindowPace
from liveloop.server.control.pace_alarms import BEHIND, CAUGHT_UP, BehindEpisodes, RisingCounter


def pace(backlog: int, long_pace: float | None, full: bool = True) -> Pace:
    window = WindowPace(300, 0.5, None if long_pace is None else 0.5 * long_pace, long_pace, 8.0, 300 if full else 100)
    return Pace(backlog, False, window, window)


def test_an_episode_is_reported_when_it_starts_and_when_it_ends():
    episodes = BehindEpisodes(min_pace=0.8, backlog=50)
    assert episodes.judge("sao", pace(80, 0.5, full=False), False, 0) is None  # not sustained over the long window yet
    started = episodes.judge("sao", pace(80, 0.5), False, 10)
    assert started is not None and started.kind == BEHIND and started.at == 10 and episodes.behind("sao")
    for t, backlog in ((20, 120), (30, 200), (40, 40), (50, 26)):  # still behind: nothing new, above half the threshold
        assert episodes.judge("sao", pace(backlog, 0.3), False, t) is None
    ended = episodes.judge("sao", pace(25, 1.5), False, 60)
    assert ended is not None and ended.kind == CAUGHT_UP and ended.since == 10 and not episodes.behind("sao")
    assert episodes.judge("sao", pace(10, 0.5), False, 70) is None  # slow, but nothing waits to speak of
    again = episodes.judge("sao", pace(50, 0.7), False, 80)
    assert again is not None and again.kind == BEHIND and episodes.since("sao") == 80


def test_a_lane_keeping_up_or_with_nothing_arriving_is_not_behind():
    episodes = BehindEpisodes(min_pace=0.8, backlog=50)
    assert episodes.judge("sao", pace(500, 0.8), False, 0) is None  # a large backlog it keeps up with
    assert episodes.judge("sao", pace(500, None), False, 10) is None  # nothing arrived
    assert not episodes.behind("sao")


def test_lanes_are_judged_apart_and_a_paused_one_not_at_all():
    episodes = BehindEpisodes(min_pace=0.8, backlog=50)
    assert episodes.judge("sao:cozy", pace(80, 0.1), True, 0) is None and not episodes.behind("sao:cozy")
    assert episodes.judge("sao:overflow", pace(80, 0.1), False, 0) is not None
    episodes.restore("sao:cozy", True, -100)
    assert episodes.judge("sao:cozy", pace(0, 0.1), True, 10) is None and episodes.behind("sao:cozy")  # paused: kept as it was
    assert episodes.judge("sao:cozy", pace(0, 0.1), False, 20).kind == CAUGHT_UP


def test_a_restored_episode_is_not_reported_again():
    episodes = BehindEpisodes(min_pace=0.8, backlog=50)
    episodes.restore("sao", True, 5)
    assert episodes.judge("sao", pace(80, 0.5), False, 10) is None and episodes.since("sao") == 5


def test_refused_steps_are_counted_every_look_and_reported_at_most_once_a_minute():
    refusals = RisingCounter(every_seconds=60)
    figures = {"step_kl": 0.31, "lr": 1e-5}
    assert refusals.observe("sao", 3, 10, figures, 0) == (0, None)  # the first look: a baseline, not news
    new, report = refusals.observe("sao", 4, 11, figures, 10)
    assert new == 1 and report is not None
    assert (report.count, report.total, report.step, report.exact, report.figures) == (1, 4, 11, True, figures)
    assert refusals.observe("sao", 5, 12, {"step_kl": 0.4}, 20) == (1, None)  # within the minute: counted, not reported
    assert refusals.observe("sao", 7, 15, {"step_kl": 0.5}, 40) == (2, None)  # two of three steps refused
    assert refusals.observe("sao", 7, 16, {"step_kl": 0.01}, 69) == (0, None)
    new, report = refusals.observe("sao", 7, 17, {"step_kl": 0.01}, 70)  # the minute is up: the three held back
    assert new == 0 and report is not None
    assert (report.count, report.total, report.step, report.exact, report.figures) == (3, 7, 15, False, {"step_kl": 0.5})
    assert refusals.observe("sao", 7, 18, figures, 200) == (0, None)  # nothing held back: nothing to report


def test_a_restarted_learners_counter_is_a_new_start_and_lanes_are_limited_apart():
    refusals = RisingCounter(every_seconds=60)
    refusals.observe("sao:cozy", 5, 40, {}, 0)
    assert refusals.observe("sao:cozy", 0, 0, {}, 10) == (0, None)  # restarted from its published version
    new, report = refusals.observe("sao:cozy", 1, 1, {}, 20)
    assert new == 1 and report is not None and report.count == 1
    refusals.observe("sao:overflow", 0, 3, {}, 20)
    new, report = refusals.observe("sao:overflow", 1, 4, {}, 25)  # another lane: its own minute
    assert new == 1 and report is not None
    assert refusals.observe("sao:cozy", None, 2, {}, 30) == (0, None)  # the counter not known: nothing


def test_a_restored_report_time_holds_the_limit():
    refusals = RisingCounter(every_seconds=60)
    refusals.restore("sao", 100)
    refusals.observe("sao", 0, 0, {}, 110)
    assert refusals.observe("sao", 1, 1, {}, 120) == (1, None)
    assert refusals.observe("sao", 1, 2, {}, 160)[1].count == 1
