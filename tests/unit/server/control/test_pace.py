"""The learner's pace as a pure function (server/control/pace.py `measure`): arrival times and looks at
the lane's cursor in, rates, backlog, pace and seconds per rating out, every figure computed by hand."""

from __future__ import annotations

import pytest

from liveloop.server.control.pace import Look, NoLook, measure, window_pace

# a rating every 2 s (ids 1..150 at t = 2, 4, ..., 300): 0.5 per second
STREAM = [(i, 2.0 * i) for i in range(1, 151)]
# a learner at 8 s a rating, training 0.1 per second: a look every 50 s, cursor and samples at t / 10
SLOW = [Look(t, t // 10, t // 10, 8.0 * (t // 10)) for t in range(0, 301, 50)]


def test_a_slow_learner_trains_a_fifth_of_what_arrives():
    pace = measure(STREAM, SLOW, now=300, short=60, long=300)
    assert pace.backlog == 120 and not pace.backlog_capped  # ids 31..150 wait
    long = pace.long
    # long: from the look at 0 (cursor 0) to 300 (cursor 30); arrivals in (0, 300]: all 150
    assert long.arriving == pytest.approx(0.5) and long.trained == pytest.approx(0.1) and long.pace == pytest.approx(0.2)
    assert long.seconds_per_rating == pytest.approx(8.0) and long.measured_seconds == 300 and long.full
    short = pace.short
    # short: from the newest look at or before 240 (200: cursor 20) to 300 (cursor 30): 10 in 100 s;
    # arrivals in (240, 300]: ids 121..150
    assert short.arriving == pytest.approx(0.5) and short.trained == pytest.approx(0.1) and short.pace == pytest.approx(0.2)
    assert short.measured_seconds == 100 and short.full


def test_a_learner_that_keeps_up_has_pace_one_and_no_backlog():
    looks = [Look(t, t // 2, t // 2, 1.0 * (t // 2)) for t in range(0, 301, 50)]
    pace = measure(STREAM, looks, now=300, short=60, long=300)
    assert pace.backlog == 0
    assert pace.long.trained == pytest.approx(0.5) and pace.long.pace == pytest.approx(1.0)
    assert pace.long.seconds_per_rating == pytest.approx(1.0)


def test_one_look_measures_arrivals_and_backlog_but_no_training_rate():
    pace = measure(STREAM, [Look(300, 100)], now=300, short=60, long=300)
    assert pace.backlog == 50
    assert pace.long.arriving == pytest.approx(0.5) and pace.long.trained is None and pace.long.pace is None
    assert pace.long.seconds_per_rating is None and pace.long.measured_seconds == 0 and not pace.long.full


def test_the_window_is_not_full_until_the_looks_span_it():
    pace = measure(STREAM, SLOW[:3], now=100, short=60, long=300)  # looks at 0, 50, 100
    assert pace.long.measured_seconds == 100 and not pace.long.full
    assert pace.long.arriving == pytest.approx(50 / 300)  # what arrived in the window, over the whole window
    assert pace.long.trained == pytest.approx(0.1)
    assert pace.short.measured_seconds == 100 and pace.short.full  # anchored at the look at 0 (<= 40)


def test_nothing_arriving_leaves_the_pace_undefined():
    looks = [Look(1000, 140, 140, 1120.0), Look(1100, 150, 150, 1200.0)]
    pace = measure(STREAM, looks, now=1100, short=60, long=300)
    assert pace.long.arriving == 0 and pace.long.trained == pytest.approx(0.1) and pace.long.pace is None
    assert pace.backlog == 0


def test_only_the_ratings_given_count_past_the_cursor():
    """Quarantined keys' and other segments' ratings are not in the store's answer: ids have gaps."""
    ratings = [(2, 10.0), (4, 20.0), (6, 30.0), (9, 40.0)]
    pace = window_pace(ratings, [Look(0, 1), Look(40, 6)], now=40, seconds=40)
    assert pace.trained == pytest.approx(3 / 40)  # 2, 4 and 6
    assert measure(ratings, [Look(0, 1), Look(40, 6)], 40, 40, 40).backlog == 1  # 9


def test_seconds_per_rating_uses_the_looks_where_the_learner_answered():
    looks = [Look(0, 0), Look(50, 5, 5, 40.0), Look(100, 10, 10, 80.0), Look(150, 12)]  # first and last: the store's cursor
    pace = window_pace(STREAM, looks, now=150, seconds=150)
    assert pace.seconds_per_rating == pytest.approx(8.0) and pace.trained == pytest.approx(12 / 150)


def test_a_capped_read_says_the_backlog_is_a_lower_bound():
    assert measure(STREAM, [Look(300, 0)], 300, 60, 300, capped=True).backlog_capped


def test_no_look_is_refused():
    with pytest.raises(NoLook):
        measure(STREAM, [], 300, 60, 300)
