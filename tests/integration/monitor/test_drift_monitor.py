"""The drift monitor over a real store: it follows ratings in arrival order, alarms on a shift in one
segment's reward rate (and not in the stable one), and replays quietly after a restart."""

import random
import sys

from liveloop.monitor.config import MonitorConfig
import threading

from liveloop.monitor.drift import ALL, DriftMonitor
from liveloop.store import FeedbackRecord, ResponseRecord, Store


def _traffic(store: Store, start: int, n: int, rates: dict[str, float], seed: int) -> None:
    rng = random.Random(seed)
    recs, ratings = [], []
    for i in range(start, start + n):
        topic = "cats" if i % 2 else "dogs"
        recs.append(ResponseRecord(f"r{i}", "k", "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": topic}))
        ratings.append(FeedbackRecord(f"r{i}", "k", int(rng.random() < rates[topic])))
    store.feedback.write_batch(recs)
    store.feedback.write_batch(ratings)


def test_alarm_in_the_drifting_segment_only(store):
    monitor = DriftMonitor(MonitorConfig(), store.feedback)
    _traffic(store, 0, 600, {"cats": 0.8, "dogs": 0.5}, seed=1)
    assert monitor.catch_up() == []
    _traffic(store, 600, 600, {"cats": 0.2, "dogs": 0.5}, seed=2)  # cats users changed their minds
    alarms = monitor.catch_up(batch=100)  # several reads
    assert {a.segment for a in alarms} >= {"cats"} and "dogs" not in {a.segment for a in alarms}
    cats = next(a for a in alarms if a.segment == "cats")
    assert cats.alarm.direction == "down" and cats.alarm.before > 0.6
    state = monitor.state()
    assert state["segments"]["cats"]["n"] == 600 and state["overall"]["ratings"] == 1200
    assert sum(b.reward.n for b in monitor.series()) == 1200 and monitor.last_id == store.feedback.last_rating_id()


def test_replay_after_restart_reads_only_the_newest_ratings(store):
    _traffic(store, 0, 300, {"cats": 0.5, "dogs": 0.5}, seed=3)
    monitor = DriftMonitor(MonitorConfig(replay_events=100), store.feedback)
    monitor.catch_up(replay=True)
    assert monitor.detectors[ALL].count == 100
    everything = DriftMonitor(MonitorConfig(replay_events=1000), store.feedback)
    everything.catch_up(replay=True)
    assert everything.detectors[ALL].count == 300


def _tagged(store: Store, start: int, topics: list[str]) -> None:
    recs = [
        ResponseRecord(f"s{start + i}", "k", "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": t})
        for i, t in enumerate(topics)
    ]
    store.feedback.write_batch(recs)
    store.feedback.write_batch([FeedbackRecord(r.id, "k", 1) for r in recs])


def test_segments_are_bounded_and_the_least_recently_seen_makes_room(store):
    """A client inventing a new segment tag per request cannot grow the detectors without end, nor pin
    the slots: past `max_segments` a new segment replaces the one seen least recently, so the segments
    users keep rating stay tracked."""
    _tagged(store, 0, ["cats", "dogs"] + [f"junk{i}" for i in range(3)])  # 5 slots, all taken
    monitor = DriftMonitor(MonitorConfig(max_segments=5), store.feedback)
    monitor.catch_up()
    _tagged(store, 100, ["cats", "dogs"] * 3)  # cats and dogs seen again: the junk is now the oldest
    _tagged(store, 200, [f"new{i}" for i in range(3)])  # three new segments evict the three junk ones
    monitor.catch_up()
    assert list(monitor.segments) == ["cats", "dogs", "new0", "new1", "new2"]
    assert len(monitor.detectors) == 1 + 5 and set(monitor.detectors) == {ALL, *monitor.segments}
    assert monitor.segments["cats"] == [4, 4] and monitor.evicted == 3
    _tagged(store, 300, [f"flood{i}" for i in range(40)])
    monitor.catch_up()
    assert len(monitor.segments) == 5 and len(monitor.detectors) == 6  # bounded whatever arrives
    assert monitor.state()["segments_evicted"] == 43


def test_the_web_thread_reads_while_the_poller_writes(store):
    """`state()` and `series()` on one thread while `catch_up()` raises alarms and moves segments on
    another, the interpreter switching threads every microsecond: no read sees a container change
    under it (unlocked, `state()` raised "deque mutated during iteration" here)."""
    for k in range(6):
        recs = [
            ResponseRecord(f"s{k}-{i}", "k", "m", 0, "chat", (1,), (2,), (-1.0,), "stop", 1.0, 1.0, 1.0, request_meta={"topic": f"t{i % 7}"})
            for i in range(400)
        ]
        store.feedback.write_batch(recs)
        store.feedback.write_batch([FeedbackRecord(r.id, "k", (i // 5) % 2) for i, r in enumerate(recs)])  # runs of 5: alarms
    monitor = DriftMonitor(MonitorConfig(max_segments=8, warmup=1, threshold=0.5, delta=0.0), store.feedback, max_alarms=100_000)
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                monitor.state()
                monitor.series()
        except BaseException as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        monitor.catch_up(batch=10)
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(switch)
    assert errors == [] and monitor.detectors[ALL].count == 2400 and len(monitor.alarms) > 100
