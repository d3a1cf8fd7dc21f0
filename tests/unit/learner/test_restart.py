"""When a lane's adapter starts over (learner/restart.py): a fall of `drop` from the best windowed mean."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liveloop.learner.restart import RestartOnDrop


def test_a_fall_from_the_best_window_starts_over_once_and_the_window_starts_empty():
    r = RestartOnDrop(window=4, drop=0.5)
    assert not r.add([1, 1, 1])  # the window is not full yet: no verdict
    assert not r.add([1])  # best 1.0
    assert not r.add([0])  # 0.75
    assert r.stats() == {"learner/restarts": 0.0, "learner/restart_window_mean": 0.75, "learner/restart_best": 1.0}
    assert r.add([0, 1, 1])  # 0.5 after the second 0: fell 0.5 from 1.0; the rest of the batch is not counted
    assert r.stats() == {"learner/restarts": 1.0}
    assert not r.add([0, 0, 0, 0, 0, 0])  # a fresh start that never learned is never started over
    assert r.restarts == 1


def test_forgetting_judges_afresh():
    r = RestartOnDrop(window=2, drop=0.5)
    assert not r.add([1, 1])
    r.forget()  # a rollback: the best of the adapter that served before says nothing of this one
    assert not r.add([0, 0]) and r.stats() == {"learner/restarts": 0.0, "learner/restart_window_mean": 0.0, "learner/restart_best": 0.0}


def test_a_window_that_was_never_high_does_not_fire():
    r = RestartOnDrop(window=3, drop=0.4)
    assert not any(r.add([x]) for x in [0, 0, 1, 0, 0, 1, 0, 0, 0])  # best 1/3, never 0.4 above the low
    assert r.add([1, 1, 1, 0, 0, 0]) and r.restarts == 1  # learned (1.0), then [1, 0, 0]: 0.67 below


@pytest.mark.parametrize("window, drop", [(0, 0.5), (3, 0.0), (3, 1.5)])
def test_bad_settings_are_refused(window, drop):
    with pytest.raises(ValueError):
        RestartOnDrop(window, drop)


@given(st.lists(st.sampled_from([0, 1]), max_size=200), st.integers(1, 20), st.sampled_from([0.25, 0.5, 0.75, 1.0]))
def test_it_fires_exactly_when_a_full_window_is_drop_below_the_best_since_the_last_start(rewards, window, drop):
    r = RestartOnDrop(window, drop)
    seen: list[int] = []
    for x in rewards:
        fired = r.add([x])
        seen.append(x)
        means = [sum(seen[i - window:i]) / window for i in range(window, len(seen) + 1)]
        expected = bool(means) and max(means) - means[-1] >= drop
        assert fired == expected
        if fired:
            seen = []
