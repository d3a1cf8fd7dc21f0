"""The stability experiment's verdict on whether the reward holds its plateau, by hand."""

from __future__ import annotations

import pytest

from liveloop.experiments.stability import peak_and_hold, stability_numbers


def test_a_reward_that_rises_and_holds():
    rewards = [0.0] * 10 + [1.0] * 30
    n = peak_and_hold(rewards, 10)
    assert n["reward_peak"] == 1.0 and n["reward_min_after_peak"] == 1.0 and n["reward_final"] == 1.0 and n["held"]


def test_a_reward_that_slides_back_is_not_held():
    rewards = [1.0] * 20 + [0.0] * 20
    n = peak_and_hold(rewards, 10)
    assert n["reward_peak"] == 1.0 and n["reward_min_after_peak"] == 0.0 and not n["held"]
    n = peak_and_hold([1.0] * 10 + [1.0, 0.0] * 5 + [1.0] * 10, 10)  # the window dips to 0.5: more than 0.05
    assert n["reward_min_after_peak"] == pytest.approx(0.5) and not n["held"]


def test_too_few_events_give_no_verdict():
    assert peak_and_hold([1.0] * 5, 10)["held"] is None


def test_numbers_read_the_trace_by_quarter():
    class Event:
        def __init__(self, t, r):
            self.t_reply, self.reward, self.rated = t, r, True

    trace = [{"step": i, "learner/kl": float(i), "learner/step_kl": 0.01, "learner/entropy": 2.0, "critic/value_error": 0.5,
              "learner/response_length": 40.0, "learner/kept_fraction": 1.0, "critic/grad_norm": 1.0} for i in range(8)]
    n = stability_numbers([Event(i, i % 2) for i in range(40)], trace, 10)
    assert n["kl_to_base_by_quarter"] == [0.5, 2.5, 4.5, 6.5] and n["feedback_events"] == 40
    assert n["held"] is not None and n["hold_window"] == 10


def test_trace_reads_a_learner_or_the_mean_of_its_segment_lanes():
    from liveloop.experiments.stability import learner_metrics

    plain = learner_metrics({"step": 3, "metrics": {"learner/kl": 0.2}})
    assert plain["learner/kl"] == 0.2 and plain["learner/entropy"] is None
    lanes = learner_metrics({"step": 9, "segments": {
        "cozy": {"metrics": {"learner/kl": 0.2, "learner/entropy": 1.0}},
        "night": {"metrics": {"learner/kl": 0.4}},
        "overflow": {"metrics": {}},
    }})
    assert abs(lanes["learner/kl"] - 0.3) < 1e-12 and lanes["learner/entropy"] == 1.0 and lanes["critic/value_error"] is None
