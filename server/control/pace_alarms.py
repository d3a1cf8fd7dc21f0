"""The learner's two alarms, as state per lane with time passed in (`now`), nothing read or written here:
- `BehindEpisodes`: a lane falls behind when, over the whole long window, it trains fewer than
  `min_pace` of the ratings arriving and at least `backlog` of them wait; it has caught up once at most
  half as many wait. `judge` returns a `PaceTransition` at the start and at the end of an episode only.
  A paused lane is not judged (its backlog grows by the operator's choice).
- `RisingCounter`: one of the learner's counters of trouble (steps the trust region refused,
  `learner/rejected_steps`; rated replies it could not score and skipped, `learner/skipped_samples`);
  `observe` returns what is new since the last look (for the counter metric) and at most one
  `CounterReport` per lane every `every_seconds`, counting the ones between. A counter that goes back
  (a restarted learner) is a new start, not news.
`restore` takes what the event log says (a replica that starts, or becomes the leader), so an episode
is recorded once whoever records it (server/control/learner_watch.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from liveloop.server.control.pace import Pace

BEHIND, CAUGHT_UP, REFUSED = "learner_behind", "learner_caught_up", "learner_step_refused"  # operator event kinds
SKIPPED = "learner_samples_skipped"
CAUGHT_UP_SHARE = 0.5  # caught up again at this share of the backlog threshold


@dataclass(frozen=True)
class PaceTransition:
    """A lane started falling behind (`kind` BEHIND) or caught up (CAUGHT_UP), at `at`."""

    kind: str
    lane: str
    at: float
    since: float | None  # CAUGHT_UP: when the episode started


@dataclass
class _Episode:
    behind: bool = False
    since: float | None = None


class BehindEpisodes:
    def __init__(self, min_pace: float, backlog: int):
        self.min_pace, self.backlog = min_pace, backlog
        self._lanes: dict[str, _Episode] = {}

    def behind(self, lane: str) -> bool:
        return self._lanes.get(lane, _Episode()).behind

    def since(self, lane: str) -> float | None:
        return self._lanes.get(lane, _Episode()).since

    def restore(self, lane: str, behind: bool, since: float | None) -> None:
        self._lanes[lane] = _Episode(behind, since if behind else None)

    def falling_behind(self, pace: Pace) -> bool:
        long = pace.long
        return long.full and long.pace is not None and long.pace < self.min_pace and pace.backlog >= self.backlog

    def caught_up(self, pace: Pace) -> bool:
        return pace.backlog <= self.backlog * CAUGHT_UP_SHARE

    def judge(self, lane: str, pace: Pace, paused: bool, now: float) -> PaceTransition | None:
        episode = self._lanes.setdefault(lane, _Episode())
        if paused:
            return None
        if not episode.behind and self.falling_behind(pace):
            episode.behind, episode.since = True, now
            return PaceTransition(BEHIND, lane, now, None)
        if episode.behind and self.caught_up(pace):
            since, episode.behind, episode.since = episode.since, False, None
            return PaceTransition(CAUGHT_UP, lane, now, since)
        return None


@dataclass(frozen=True)
class CounterReport:
    """A counter's rise in one lane to record: how many since the last report, the learner's total, and
    the figures of the lane's last step (`exact`: every step since the last look was counted, so they
    are a counted step's)."""

    lane: str
    at: float
    count: int
    total: int
    step: int
    exact: bool
    figures: dict[str, float] = field(default_factory=dict)


@dataclass
class _Counted:
    total: int | None = None  # the learner's counter at the last look
    step: int | None = None
    unreported: int = 0
    last: CounterReport | None = None  # the newest rise's figures, not reported yet
    reported_at: float | None = None


class RisingCounter:
    def __init__(self, every_seconds: float):
        self.every_seconds = every_seconds
        self._lanes: dict[str, _Counted] = {}

    def restore(self, lane: str, reported_at: float | None) -> None:
        """The last report recorded for `lane` (the rate limit holds across replicas and restarts)."""
        self._lanes.setdefault(lane, _Counted()).reported_at = reported_at

    def observe(self, lane: str, total: int | None, step: int, figures: dict[str, Any], now: float) -> tuple[int, CounterReport | None]:
        """The lane's counter (`total`; None: not known) at its step `step`, with its last step's
        `figures`. Returns what is new since the last look and the report due, if any."""
        s = self._lanes.setdefault(lane, _Counted())
        new = 0
        if total is not None:
            if s.total is not None and s.step is not None and total >= s.total and step >= s.step:
                new = total - s.total
            if new:
                s.unreported += new
                s.last = CounterReport(lane, now, 0, total, step, exact=new == step - s.step, figures=dict(figures))
            s.total, s.step = total, step
        if s.unreported and s.last is not None and (s.reported_at is None or now - s.reported_at >= self.every_seconds):
            report = CounterReport(lane, now, s.unreported, s.last.total, s.last.step, s.last.exact, s.last.figures)
            s.unreported, s.last, s.reported_at = 0, None, now
            return new, report
        return new, None
