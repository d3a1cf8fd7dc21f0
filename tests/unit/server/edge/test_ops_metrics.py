"""/metrics never fails on the learner's figures: the learner's metric keys are exported as gauges beside
the server's own metrics, and a key the server already writes as a counter (the server's
`learner/samples_skipped` beside the learner's `learner/skipped_samples` once had one name) is left out
and logged, not a 500 for every scrape. liveloop.metrics says which writer clashed (MetricClash)."""

from __future__ import annotations

import asyncio

import pytest

from liveloop.learner.status import LaneStatus, LearnerStatus
from liveloop.metrics import MetricClash, Metrics
from liveloop.server.edge.ops.serving import Ops


class _Learner:
    def __init__(self, metrics: dict[str, float]):
        self.metrics = metrics

    def status(self) -> LearnerStatus:
        lane = LaneStatus(segment=None, version=3, cursor=7, pending_cursor=7, step=2, samples=7, skipped_steps=0, paused=False,
                          busy_seconds=1.0, idle_seconds=0.0, metrics=self.metrics)
        return LearnerStatus("none", (lane,))


def test_a_name_written_as_two_kinds_or_with_two_label_sets_is_a_clash():
    m = Metrics()
    m.inc("learner/refused_steps", 1, segment="")
    with pytest.raises(MetricClash, match="counter, not a gauge"):
        m.set("learner/refused_steps", 2.0, segment="")
    with pytest.raises(MetricClash):
        m.inc("learner/refused_steps", 1)  # no labels where its first writer had `segment`


def test_a_learner_key_that_clashes_is_left_out_and_the_rest_are_exported(caplog):
    m = Metrics()
    m.inc("learner/samples_skipped", 2, segment="")  # the server's own counter
    ops = Ops(None, lambda: None, None, None, m, None, 1.0, _Learner({"learner/samples_skipped": 5.0, "learner/step_kl": 0.25}), None)
    for _ in range(2):
        asyncio.run(ops._learner_metrics())
    text = m.render().decode()
    assert 'liveloop_learner_samples_skipped_total{segment=""} 2.0' in text and "liveloop_learner_step_kl 0.25" in text
    assert "liveloop_learner_version 3.0" in text
    assert caplog.text.count("learner/samples_skipped is not exported") == 1
