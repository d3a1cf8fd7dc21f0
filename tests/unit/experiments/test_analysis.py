"""The adaptation-time and share computations on synthetic curves (arithmetic in comments)."""

from __future__ import annotations

import pytest

from liveloop.experiments.analysis import (
    group_waits, moving_average, preferred_share_by_phase, readapt_after_switches, readapt_index, reward_by_phase,
)


def test_moving_average_is_trailing():
    # window 2: [1], [1, 0], [0, 1], [1, 1] -> [1, 0.5, 0.5, 1]
    assert moving_average([1, 0, 1, 1], 2) == [1.0, 0.5, 0.5, 1.0]
    with pytest.raises(ValueError):
        moving_average([1], 0)


def test_readapt_index_needs_a_full_post_switch_window():
    # window 4, threshold 0.75: windows ending at n=4: [0,0,1,1] 0.5; n=5: [0,1,1,1] 0.75 -> 5
    assert readapt_index([0, 0, 1, 1, 1, 1], 4, 0.75) == 5
    # a good start is not enough: [1, 1] alone is shorter than the window
    assert readapt_index([1, 1], 4, 0.5) is None
    assert readapt_index([1, 1, 1, 1], 4, 1.0) == 4
    assert readapt_index([0] * 100, 10, 0.1) is None


def test_readapt_on_a_step_curve():
    # 30 zeros then ones; window 10, threshold 0.6: the first window with >= 6 ones ends at 30 + 6 = 36
    assert readapt_index([0] * 30 + [1] * 30, 10, 0.6) == 36


def _ev(segment, phase, reward, t, style, preferred, rated=True, group="g", t_feedback=None):
    return {"segment": segment, "phase": phase, "reward": reward, "t_reply": t, "reply_style": style,
            "preferred": preferred, "rated": rated, "index": int(t), "group": group, "t_feedback": t_feedback}


def test_readapt_after_switches_counts_the_segments_own_events_and_seconds():
    events = [_ev("a", 0, 1, t, "cute", "cute") for t in range(5)]
    # after the switch to classical: 4 old-style misses then classical hits, 2 s apart
    post = [("cute", 0)] * 4 + [("classical", 1)] * 6
    events += [_ev("a", 1, r, 10 + 2 * i, s, "classical") for i, (s, r) in enumerate(post)]
    events += [_ev("b", 0, 0, 100 + t, "cute", "classical") for t in range(20)]  # another segment: ignored
    events += [_ev("a", 1, 0, 99, "cute", "classical", rated=False)]  # unrated: counts for shares, not rewards
    (r,) = readapt_after_switches(events, [("a", 1, 5, "cute", "classical")], window=4, threshold=0.75)
    # rewards [0,0,0,0,1,1,1,1,1,1]: window 4 reaches 3/4 at n = 7 ([0,1,1,1])
    assert (r.events, r.events_available) == (7, 10)
    assert r.seconds == pytest.approx(12.0)  # t of the 7th (10 + 2*6 = 22) minus the first (10)
    # last 4 replies of the phase by time: classical (t=24,26,28) and the unrated cute one at t=99
    assert r.old_style_share == pytest.approx(0.25) and r.new_style_share == pytest.approx(0.75)
    assert r.final_reward == 1.0


def test_never_readapting_is_none():
    events = [_ev("a", 1, 0, t, "cute", "classical") for t in range(50)]
    (r,) = readapt_after_switches(events, [("a", 1, 5, "cute", "classical")], window=10, threshold=0.5)
    assert r.events is None and r.seconds is None and r.old_style_share == 1.0 and r.final_reward == 0.0


def test_reward_and_share_by_phase_and_group_waits():
    events = [_ev("a", 0, r, t, s, "cute") for t, (r, s) in enumerate([(0, "x"), (1, "cute"), (1, "cute")])]
    assert reward_by_phase(events, 2) == {"a/phase0": 1.0}  # last 2 rated: [1, 1]
    assert preferred_share_by_phase(events, 3) == {"a/phase0": pytest.approx(2 / 3)}
    waits = group_waits([_ev("a", 0, 1, 0, "x", "x", group="g1", t_feedback=1.0),
                         _ev("a", 0, 1, 0, "x", "x", group="g1", t_feedback=4.5),
                         _ev("a", 0, 1, 0, "x", "x", group="g2", t_feedback=2.0)])
    assert waits == [3.5]  # g2 has one rating: no wait to measure
