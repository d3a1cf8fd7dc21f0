"""The drift monitor over a real store: it follows ratings in arrival order, alarms on a shift in one
segment's reward rate (and not in the stable one), and replays quietly after a restart."""

import random

from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.drift import ALL, OVERFLOW, DriftMonitor
from liveloop.store import FeedbackRecord, ResponseRecord, Store


def _traffic(store: Store, start: int, n: int, rates: dict[str, float], seed: int) -> None:
    rng = random.Random(seed)
    recs, ratings = [], []
    for i in range(start, start + n):
        topic = "cats" if i % 2 else "dogs"
        recs.append(ResponseRecord(f"r{i}", "k", "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": topic}))
        ratings.append(FeedbackRecord(f"r{i}", "k", int(rng.random() < rates[topic])))
    store.write_batch(recs)
    store.write_batch(ratings)


def test_alarm_in_the_drifting_segment_only(store):
    monitor = DriftMonitor(MonitorConfig(), store)
    _traffic(store, 0, 600, {"cats": 0.8, "dogs": 0.5}, seed=1)
    assert monitor.catch_up() == []
    _traffic(store, 600, 600, {"cats": 0.2, "dogs": 0.5}, seed=2)  # cats users changed their minds
    alarms = monitor.catch_up(batch=100)  # several reads
    assert {a.segment for a in alarms} >= {"cats"} and "dogs" not in {a.segment for a in alarms}
    cats = next(a for a in alarms if a.segment == "cats")
    assert cats.alarm.direction == "down" and cats.alarm.before > 0.6
    state = monitor.state()
    assert state["segments"]["cats"]["n"] == 600 and state["overall"]["ratings"] == 1200
    assert sum(b.reward.n for b in monitor.series()) == 1200 and monitor.last_id == store.last_rating_id()


def test_replay_after_restart_reads_only_the_newest_ratings(store):
    _traffic(store, 0, 300, {"cats": 0.5, "dogs": 0.5}, seed=3)
    monitor = DriftMonitor(MonitorConfig(replay_events=100), store)
    monitor.catch_up(replay=True)
    assert monitor.detectors[ALL].count == 100
    everything = DriftMonitor(MonitorConfig(replay_events=1000), store)
    everything.catch_up(replay=True)
    assert everything.detectors[ALL].count == 300


def test_segments_are_bounded(store):
    """A client inventing a new segment tag per request cannot grow the detectors without end: past
    `max_segments` they share one overflow segment."""
    recs = [
        ResponseRecord(f"s{i}", "k", "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": f"t{i}"})
        for i in range(40)
    ]
    store.write_batch(recs)
    store.write_batch([FeedbackRecord(f"s{i}", "k", 1) for i in range(40)])
    monitor = DriftMonitor(MonitorConfig(max_segments=5), store)
    monitor.catch_up()
    assert len(monitor.detectors) == 1 + 5 + 1  # overall, 5 segments, the overflow
    assert monitor.segments[OVERFLOW] == [35, 35]
