"""The drift monitor: follows the feedback stream in arrival order and keeps what operators watch.

    monitor = DriftMonitor(config, store.feedback)
    monitor.catch_up(replay=True)     # at start: replay the newest `replay_events` ratings, quietly
    new_alarms = monitor.catch_up()   # then, every poll: the ratings past the last one seen

It keeps one change detector over all ratings and one per user segment (the request metadata key
`segment_key`, e.g. `topic`), the reward rate per time bucket and per segment, and the alarms the
detectors raised. Per-version traffic is not kept here: the store aggregates it (`version_traffic`).
A replaced rating (the same key rating a response again) counts as a new rating event. Ratings of
quarantined keys are not read (`store.feedback.rating_events(trusted=True)`): from its quarantine on a key moves no
detector, bucket or segment (what was observed before it stays).

Segments are bounded (`max_segments`): a segment not tracked yet takes the slot of the one seen least
recently, whose counts and detector are dropped (its raised alarms stay). So a client inventing a tag
per request only churns slots of segments nobody rates any more; it cannot pin them the way a first-come
allocation let early junk tags hold every slot for good. The poller (a worker thread) writes while the
web thread reads (`state`, `series`): one lock guards both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.detector import Alarm, make_detector
from liveloop.monitor.stats import Rate, wilson
from liveloop.store import RatingEvent
from liveloop.store.feedback import FeedbackQueries

ALL = "*"  # the segment name of the detector over every rating
MAX_BUCKETS = 10_000  # time buckets kept (a week of 60 s buckets); older ones are dropped


@dataclass(frozen=True)
class RaisedAlarm:
    segment: str
    alarm: Alarm
    feedback_id: int
    policy_version: int
    at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            **self.alarm.as_dict(),
            "feedback_id": self.feedback_id,
            "policy_version": self.policy_version,
            "at": self.at.timestamp(),
        }


@dataclass(frozen=True)
class Bucket:
    """The ratings of one time bucket: its start (unix seconds) and reward rate with its interval."""

    t: int
    reward: Rate


class DriftMonitor:
    def __init__(self, config: MonitorConfig, feedback: FeedbackQueries, max_alarms: int = 500):
        self.config = config
        self.feedback = feedback
        self.last_id = 0
        self.detectors = {ALL: make_detector(config)}
        self.buckets: dict[int, list[int]] = {}  # bucket start (unix s) -> [ratings, positive]
        # segment -> [ratings, positive], least recently seen first
        self.segments: OrderedDict[str, list[int]] = OrderedDict()
        self.evicted = 0  # segments dropped to make room for newer ones
        self.alarms: deque[RaisedAlarm] = deque(maxlen=max_alarms)
        self._lock = threading.Lock()

    def observe(self, event: RatingEvent) -> list[RaisedAlarm]:
        with self._lock:
            return self._observe(event)

    def _slot(self, segment: str) -> list[int]:
        """`segment`'s counts, now the most recently seen; a new one evicts the least recently seen."""
        counts = self.segments.get(segment)
        if counts is not None:
            self.segments.move_to_end(segment)
            return counts
        while len(self.segments) >= self.config.max_segments:
            old, _ = self.segments.popitem(last=False)
            self.detectors.pop(old, None)
            self.evicted += 1
        self.detectors[segment] = make_detector(self.config)
        counts = self.segments[segment] = [0, 0]
        return counts

    def _observe(self, event: RatingEvent) -> list[RaisedAlarm]:
        x = 1.0 if event.reward > 0 else 0.0
        self.last_id = max(self.last_id, event.feedback_id)
        bucket = int(event.created_at.timestamp() // self.config.window_seconds * self.config.window_seconds)
        counts = self.buckets.setdefault(bucket, [0, 0])
        counts[0] += 1
        counts[1] += int(x)
        if len(self.buckets) > MAX_BUCKETS:
            for old in sorted(self.buckets)[: len(self.buckets) - MAX_BUCKETS]:
                del self.buckets[old]
        segment = str((event.request_meta or {}).get(self.config.segment_key, "")) or None
        if segment == ALL:  # a tag that names the overall detector moves only that one
            segment = None
        raised = []
        names = [ALL] if segment is None else [ALL, segment]
        for name in names:
            if name != ALL:
                seg = self._slot(name)
                seg[0] += 1
                seg[1] += int(x)
            alarm = self.detectors[name].update(x)
            if alarm is not None:
                raised.append(RaisedAlarm(name, alarm, event.feedback_id, event.policy_version, event.created_at))
        self.alarms.extend(raised)
        return raised

    def catch_up(self, replay: bool = False, batch: int = 5000) -> list[RaisedAlarm]:
        """Read and observe every rating past the last one seen; returns the alarms raised. With
        `replay`, start from the newest `replay_events` ratings (after a restart)."""
        if replay and self.last_id == 0 and self.config.replay_events:
            # the id just before the oldest of the newest `replay_events` ratings (0: replay them all)
            self.last_id = self.feedback.last_rating_id(skip=self.config.replay_events)
        raised: list[RaisedAlarm] = []
        while True:
            events = self.feedback.rating_events(after_id=self.last_id, limit=batch, trusted=True)
            for event in events:
                raised.extend(self.observe(event))
            if len(events) < batch:
                return raised

    # -- views ---------------------------------------------------------------------------------
    def series(self, since: float | None = None) -> list[Bucket]:
        """Reward rate per time bucket, oldest first, with Wilson intervals."""
        with self._lock:
            buckets = {start: tuple(counts) for start, counts in self.buckets.items()}
        out = []
        for start in sorted(buckets):
            if since is not None and start + self.config.window_seconds <= since:
                continue
            n, pos = buckets[start]
            out.append(Bucket(start, wilson(pos, n, self.config.confidence)))
        return out

    def state(self) -> dict[str, Any]:
        with self._lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        return {
            "detector": self.config.detector,
            "delta": self.config.delta,
            "threshold": self.config.threshold,
            "last_feedback_id": self.last_id,
            "overall": self.detectors[ALL].state(),
            "segment_key": self.config.segment_key,
            "segments_evicted": self.evicted,
            "segments": {
                name: {**wilson(pos, n, self.config.confidence).as_dict(), "detector": self.detectors[name].state()}
                for name, (n, pos) in sorted(self.segments.items())
            },
            "alarms": [a.as_dict() for a in self.alarms],
        }
