"""Where a learner stands, typed: `LaneStatus` per lane, `LearnerStatus` for the learner as a whole.

    status = learner.status()          # either kind of learner (lanes.build_learner)
    status.step, status.idle_fraction  # totals over its lanes
    status.version                     # the one lane's; None with a lane per segment (each has its own)
    status.lane(Lineage("cozy")).cursor
    status.as_dict()                   # the JSON the admin API and the CLI print (the edges only)

A plain learner is one lane (segment None); with `[segments] adapters` on, one lane per segment. The
totals are the same rules for both: steps, samples and skipped steps add up, busy time adds up (the
lanes take turns on one thread), idle time is the longest any lane waited (they wait together), and
the learner is paused when every lane is. The status crosses the Ray actor boundary as it is (a frozen
dataclass pickles); it becomes a dict only where it leaves as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from liveloop.segments import Lineage


def _idle_fraction(busy: float, idle: float) -> float:
    return idle / (busy + idle) if busy + idle else 1.0


@dataclass(frozen=True)
class LaneStatus:
    segment: str | None  # None: the plain learner on the whole policy
    version: int  # the version its weights descend from (last published)
    cursor: int  # last feedback id included in `version`
    pending_cursor: int  # last feedback id trained on since
    step: int
    samples: int
    skipped_steps: int
    paused: bool
    busy_seconds: float
    idle_seconds: float
    metrics: dict[str, float] = field(default_factory=dict, hash=False)  # the last step's

    @property
    def idle_fraction(self) -> float:
        return _idle_fraction(self.busy_seconds, self.idle_seconds)

    def as_dict(self) -> dict[str, Any]:
        status = {
            "version": self.version,
            "cursor": self.cursor,
            "pending_cursor": self.pending_cursor,
            "step": self.step,
            "samples": self.samples,
            "skipped_steps": self.skipped_steps,
            "paused": self.paused,
            "idle_fraction": self.idle_fraction,
            "busy_seconds": self.busy_seconds,
            "idle_seconds": self.idle_seconds,
            "metrics": dict(self.metrics),
        }
        return status | ({"segment": self.segment} if self.segment is not None else {})


@dataclass(frozen=True)
class LearnerStatus:
    adapters: str  # `[segments] adapters`: "none" (one lane on the whole policy), "segment", "shared"
    lanes: tuple[LaneStatus, ...]

    @property
    def single(self) -> LaneStatus | None:
        """The one lane of a plain learner; None when there is a lane per segment."""
        return self.lanes[0] if self.adapters == "none" and len(self.lanes) == 1 else None

    def lane(self, lineage: Lineage) -> LaneStatus:
        for lane in self.lanes:
            if lane.segment == lineage.segment:
                return lane
        raise KeyError(str(lineage))

    @property
    def version(self) -> int | None:
        return self.single.version if self.single is not None else None

    @property
    def cursor(self) -> int | None:
        return self.single.cursor if self.single is not None else None

    @property
    def pending_cursor(self) -> int | None:
        return self.single.pending_cursor if self.single is not None else None

    @property
    def step(self) -> int:
        return sum(lane.step for lane in self.lanes)

    @property
    def samples(self) -> int:
        return sum(lane.samples for lane in self.lanes)

    @property
    def skipped_steps(self) -> int:
        return sum(lane.skipped_steps for lane in self.lanes)

    @property
    def paused(self) -> bool:
        return all(lane.paused for lane in self.lanes)

    @property
    def busy_seconds(self) -> float:
        return sum(lane.busy_seconds for lane in self.lanes)

    @property
    def idle_seconds(self) -> float:
        return max((lane.idle_seconds for lane in self.lanes), default=0.0)

    @property
    def idle_fraction(self) -> float:
        return _idle_fraction(self.busy_seconds, self.idle_seconds)

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape: a plain learner's lane as it is; with lanes, the totals and each lane under
        "segments"."""
        if self.single is not None:
            return self.single.as_dict()
        return {
            "adapters": self.adapters,
            "step": self.step,
            "samples": self.samples,
            "skipped_steps": self.skipped_steps,
            "paused": self.paused,
            "idle_fraction": self.idle_fraction,
            "busy_seconds": self.busy_seconds,
            "idle_seconds": self.idle_seconds,
            "segments": {lane.segment: lane.as_dict() for lane in self.lanes},
        }
