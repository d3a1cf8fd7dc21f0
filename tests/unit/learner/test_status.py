"""The learner's typed status: a plain learner is one lane and its JSON is that lane's; with a lane per
segment the totals follow one rule (counts and busy time add up, idle is the longest wait, paused when
every lane is) and each lane sits under "segments"."""

from __future__ import annotations

import pickle

import pytest

from liveloop.learner.status import LaneStatus, LearnerStatus
from liveloop.segments import Lineage


def _lane(segment: str | None, step: int, busy: float, idle: float, paused: bool = False) -> LaneStatus:
    return LaneStatus(
        segment=segment, version=3, cursor=10 * step, pending_cursor=10 * step + 2, step=step, samples=4 * step,
        skipped_steps=step // 2, paused=paused, busy_seconds=busy, idle_seconds=idle, metrics={"learner/reward_mean": 0.5},
    )


def test_a_plain_learner_is_its_one_lane():
    status = LearnerStatus("none", (_lane(None, 3, busy=3.0, idle=1.0),))
    assert (status.version, status.cursor, status.pending_cursor) == (3, 30, 32)
    assert (status.step, status.samples, status.skipped_steps, status.paused) == (3, 12, 1, False)
    assert status.idle_fraction == pytest.approx(0.25)
    assert status.as_dict() == {
        "version": 3, "cursor": 30, "pending_cursor": 32, "step": 3, "samples": 12, "skipped_steps": 1, "paused": False,
        "idle_fraction": 0.25, "busy_seconds": 3.0, "idle_seconds": 1.0, "metrics": {"learner/reward_mean": 0.5},
    }


def test_lanes_add_up_and_wait_together():
    cozy, night = _lane("cozy", 4, busy=2.0, idle=5.0), _lane("night", 2, busy=1.0, idle=6.0, paused=True)
    status = LearnerStatus("segment", (cozy, night))
    assert status.single is None and status.version is None and status.cursor is None
    assert (status.step, status.samples, status.skipped_steps) == (6, 24, 3)
    assert (status.busy_seconds, status.idle_seconds) == (3.0, 6.0)  # busy adds up; idle: the longest wait
    assert status.idle_fraction == pytest.approx(6.0 / 9.0)
    assert not status.paused and LearnerStatus("segment", (night,)).paused  # paused when every lane is
    body = status.as_dict()
    assert body["adapters"] == "segment" and "version" not in body
    assert body["segments"]["night"] == night.as_dict() and body["segments"]["night"]["segment"] == "night"
    assert status.lane(Lineage("cozy")) is cozy
    with pytest.raises(KeyError):
        status.lane(Lineage("overflow"))


def test_an_idle_learner_that_never_ran_is_all_idle():
    assert _lane(None, 0, busy=0.0, idle=0.0).idle_fraction == 1.0
    assert LearnerStatus("segment", ()).idle_fraction == 1.0


def test_the_status_crosses_a_process_boundary_as_it_is():
    status = LearnerStatus("segment", (_lane("cozy", 1, 1.0, 0.0), _lane("night", 1, 1.0, 0.0)))
    assert pickle.loads(pickle.dumps(status)) == status  # what Ray does with an actor's return value
