"""Change detectors over a stream of 0/1 rewards: two-sided Page-Hinkley and CUSUM.

    detector = make_detector(config)
    for x in rewards:                 # 1.0 = thumbs up, 0.0 = thumbs down
        alarm = detector.update(x)    # an Alarm when the reward rate has shifted beyond noise

Both accumulate deviations from a reference mean minus an allowance `delta` and raise an alarm when
the accumulated deviation exceeds `threshold`, in either direction. After an alarm they restart:
the new regime becomes the reference after `warmup` ratings (no alarm is raised during warm-up).
- Page-Hinkley's reference is the running mean since the restart.
- CUSUM's reference is frozen at the mean of the warm-up ratings, with reference value k = delta.
Larger thresholds trade detection delay for fewer false alarms; `bench/drift_detector.py` measures
both on seeded synthetic streams.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from liveloop.monitor.config import MonitorConfig


@dataclass(frozen=True)
class Alarm:
    index: int  # 1-based position in the stream of the rating that raised it
    direction: str  # "down" (reward fell) or "up"
    before: float  # the reference rate the stream had
    after: float  # the rate over the most recent ratings

    def as_dict(self) -> dict[str, float | int | str]:
        return {"index": self.index, "direction": self.direction, "before": self.before, "after": self.after}


class _Detector:
    name = ""

    def __init__(self, delta: float, threshold: float, warmup: int):
        self.delta, self.threshold, self.warmup = delta, threshold, warmup
        self.count = 0  # ratings seen in all
        self._recent: deque[float] = deque(maxlen=warmup)
        self.reset()

    def reset(self) -> None:
        self.n = 0  # ratings since the last restart
        self.total = 0.0
        self.up = self.down = 0.0  # accumulated deviation statistics, both >= 0

    def _reference(self) -> float:
        raise NotImplementedError

    def _accumulate(self, x: float) -> None:
        raise NotImplementedError

    def update(self, x: float) -> Alarm | None:
        self.count += 1
        self.n += 1
        self.total += x
        self._recent.append(x)
        self._accumulate(x)
        if self.n < self.warmup or max(self.up, self.down) <= self.threshold:
            return None
        before = self._reference()
        alarm = Alarm(self.count, "up" if self.up > self.down else "down", before, sum(self._recent) / len(self._recent))
        self.reset()
        return alarm

    def state(self) -> dict[str, float | int | str]:
        return {
            "detector": self.name,
            "ratings": self.count,
            "since_restart": self.n,
            "reference": self._reference() if self.n else None,
            "up": self.up,
            "down": self.down,
            "threshold": self.threshold,
            "warming_up": self.n < self.warmup,
        }


class PageHinkley(_Detector):
    """m_t = sum (x_i - mean_i - delta); alarm when m_t - min m exceeds the threshold (and mirrored)."""

    name = "page-hinkley"

    def reset(self) -> None:
        super().reset()
        self._m_up = self._min_up = 0.0
        self._m_down = self._min_down = 0.0

    def _reference(self) -> float:
        return self.total / self.n if self.n else 0.0

    def _accumulate(self, x: float) -> None:
        mean = self.total / self.n
        self._m_up += x - mean - self.delta
        self._min_up = min(self._min_up, self._m_up)
        self._m_down += mean - x - self.delta
        self._min_down = min(self._min_down, self._m_down)
        self.up, self.down = self._m_up - self._min_up, self._m_down - self._min_down


class Cusum(_Detector):
    """S+ = max(0, S+ + x - mu0 - delta), S- = max(0, S- + mu0 - x - delta), mu0 = the warm-up mean."""

    name = "cusum"

    def reset(self) -> None:
        super().reset()
        self._mu0: float | None = None

    def _reference(self) -> float:
        if self._mu0 is not None:
            return self._mu0
        return self.total / self.n if self.n else 0.0

    def _accumulate(self, x: float) -> None:
        if self._mu0 is None:
            if self.n >= self.warmup:
                self._mu0 = self.total / self.n
            return
        self.up = max(0.0, self.up + x - self._mu0 - self.delta)
        self.down = max(0.0, self.down + self._mu0 - x - self.delta)


def make_detector(config: MonitorConfig) -> _Detector:
    cls = {"page-hinkley": PageHinkley, "cusum": Cusum}[config.detector]
    return cls(config.delta, config.threshold, config.warmup)
