"""Watching the learner keep pace (`[monitor] learner_*`), run by `Operations.watch_pace` every
`learner_check_seconds`: each lane (the plain learner's, or each segment's with adapters) is looked at
(its pending cursor, samples and busy seconds from the learner's status; the store's published cursor
and pause when the learner does not answer), its pace measured on the store's trainable ratings
(server/control/pace.py), and the alarms judged (server/control/pace_alarms.py):
- `learner_behind` when a lane falls behind, `learner_caught_up` when it has caught up (once per
  episode), with the figures; gauge `learner/behind{segment}`;
- `learner_step_refused` when the learner's `learner/rejected_steps` rises, with the step's KL and
  learning rate, at most one per lane every `learner_refused_event_seconds` (with a count); counter
  `learner/refused_steps{segment}`;
- `learner_samples_skipped` when the learner's `learner/skipped_samples` rises (rated replies it could
  not score: their reasons and counts), as often; counter `learner/samples_skipped{segment}`.
Every replica measures and exports the gauges (`learner/ratings_per_second{segment,window}`,
`trained_per_second`, `pace`, `seconds_per_rating`, `learner/backlog{segment}`; `segment` is "" for
the plain learner, `window` "short" or "long"); only the leader of `term` records events, fenced by it
(StaleLeader ends the recording of that pass). A replica re-reads the last recorded episode of each
lane when it starts or becomes the leader, so an episode is recorded once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from liveloop.metrics import Metrics
from liveloop.monitor.config import MonitorConfig
from liveloop.segments import Lineage
from liveloop.server.control.pace import Look, Pace, measure
from liveloop.server.control.pace_alarms import (
    BEHIND, CAUGHT_UP, REFUSED, SKIPPED, BehindEpisodes, CounterReport, PaceTransition, RisingCounter,
)
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.lease import StaleLeader
from liveloop.store.operator import OperatorQueries

log = logging.getLogger(__name__)

MAX_ROWS = 50_000  # ratings past a lane's cursor read per look (more: the backlog is "at least")
SCANNED = 2000  # newest operator events read back for the lanes' last episodes
FIGURES = {"learner/step_kl": "step_kl", "learner/lr": "lr", "learner/kl_coef": "kl_coef", "learner/grad_norm": "grad_norm"}


class LaneView(Protocol):
    """A lane of the learner's status (learner/status.py `LaneStatus`), as far as the pace reads it."""

    @property
    def segment(self) -> str | None: ...
    @property
    def version(self) -> int: ...
    @property
    def pending_cursor(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def busy_seconds(self) -> float: ...
    @property
    def paused(self) -> bool: ...
    @property
    def metrics(self) -> dict[str, float]: ...


class StatusView(Protocol):
    @property
    def lanes(self) -> Sequence[LaneView]: ...


@dataclass(frozen=True)
class LanePace:
    """One lane at one look: its pace, whether it is behind (since when) and its refused steps seen."""

    lineage: Lineage
    lane: str  # its cursor's name (`sao`, `sao:cozy`)
    at: float  # unix seconds
    cursor: int  # the last rating id it had trained
    answered: bool  # the learner answered (else the cursor is the store's published one)
    paused: bool
    pace: Pace
    behind: bool
    behind_since: float | None
    refused_steps: int  # refusals seen since this server watches


@dataclass(frozen=True)
class LearnerPace:
    """Every lane's pace at the last check, with the settings it was judged by."""

    at: float
    short_seconds: float
    long_seconds: float
    behind_pace: float
    behind_backlog: int
    lanes: tuple[LanePace, ...]

    @property
    def behind(self) -> bool:
        return any(lane.behind for lane in self.lanes)


def _pace_detail(lane: LanePace) -> dict[str, Any]:
    return {"lane": lane.lane, "segment": lane.lineage.segment, "cursor": lane.cursor, "answered": lane.answered, **lane.pace.as_dict()}


class LearnerWatch:
    def __init__(
        self, config: MonitorConfig, feedback: FeedbackQueries, operator: OperatorQueries, metrics: Metrics,
        lanes: Sequence[tuple[Lineage, str]], max_step_kl: float = 0.0,
    ):
        self.config, self.feedback, self.operator, self.metrics = config, feedback, operator, metrics
        self.lanes = tuple(lanes)  # (lineage, lane name)
        self.max_step_kl = max_step_kl  # `[learner] max_step_kl`, for the refusal events' context
        self.episodes = BehindEpisodes(config.learner_behind_pace, config.learner_behind_backlog)
        self.refusals = RisingCounter(config.learner_refused_event_seconds)
        self.skips = RisingCounter(config.learner_refused_event_seconds)
        self.latest: LearnerPace | None = None
        self._looks: dict[str, list[Look]] = {}
        self._refused: dict[str, int] = {}
        self._read = False  # the recorded episodes were read back
        self._term: int | None = None  # the leader's term of the last check (None: not the leader)

    # -- one check ------------------------------------------------------------------------------
    def check(self, status: StatusView | None, now: float, term: int | None) -> LearnerPace:
        """Look at every lane at `now` (`status`: the learner's, None when it did not answer), export the
        figures and, as the leader of `term` (None: not the leader), record the alarms due. Runs in a
        worker thread."""
        if not self._read or (term is not None and term != self._term):  # newly the leader: what the one before recorded counts
            self._restore()
            self._read = True
        self._term = term
        recording = term is not None
        done = []
        for lineage, lane in self.lanes:
            own = next((s for s in status.lanes if s.segment == lineage.segment), None) if status is not None else None
            look, paused, pace = self._look(lineage, lane, own, now)
            transition = self.episodes.judge(lane, pace, paused, now)
            new, report, skipped = 0, None, None
            if own is not None:
                figures = {FIGURES[k]: float(v) for k, v in own.metrics.items() if k in FIGURES}
                total = own.metrics.get("learner/rejected_steps", 0.0 if own.step == 0 else None)  # no step yet: none refused
                new, report = self.refusals.observe(lane, None if total is None else int(total), own.step, figures, now)
                skips = own.metrics.get("learner/skipped_samples")  # None: a learner that does not count them
                reasons = {k.removeprefix("learner/skipped_samples_"): float(v) for k, v in own.metrics.items() if k.startswith("learner/skipped_samples_")}
                new_skips, skipped = self.skips.observe(lane, None if skips is None else int(skips), own.step, reasons, now)
                self.metrics.inc("learner/samples_skipped", new_skips, segment=lineage.segment or "")  # not the learner gauge learner/skipped_samples
            self._refused[lane] = self._refused.get(lane, 0) + new
            self.metrics.inc("learner/refused_steps", new, segment=lineage.segment or "")
            paced = LanePace(
                lineage, lane, now, look.cursor, own is not None, paused, pace,
                self.episodes.behind(lane), self.episodes.since(lane), self._refused[lane],
            )
            if recording:
                recording = self._record(paced, transition, report, skipped, None if own is None else own.version, term)
            done.append(paced)
        self.latest = LearnerPace(
            now, self.config.learner_short_window_seconds, self.config.learner_long_window_seconds,
            self.config.learner_behind_pace, self.config.learner_behind_backlog, tuple(done),
        )
        self._export(self.latest)
        return self.latest

    def _look(self, lineage: Lineage, lane: str, own: LaneView | None, now: float) -> tuple[Look, bool, Pace]:
        """The lane's look at `now`, whether it is paused, and its pace over the looks kept."""
        if own is not None:
            look, paused = Look(now, own.pending_cursor, own.samples, own.busy_seconds), own.paused
        else:
            look, paused = Look(now, self.feedback.get_cursor(lane)), self.operator.learning_paused(lane)
        looks = self._remember(lane, look)
        c = self.config
        since = datetime.fromtimestamp(now - c.learner_long_window_seconds, tz=timezone.utc)
        rows, capped = self.feedback.trainable_since(since, looks[0].cursor, lineage.segment, MAX_ROWS)
        ratings = [(rid, at.timestamp()) for rid, at in rows]
        pace = measure(ratings, looks, now, c.learner_short_window_seconds, c.learner_long_window_seconds, capped)
        return look, paused, pace

    def _remember(self, lane: str, look: Look) -> list[Look]:
        """The lane's looks with `look`: started over when its cursor or sample counter went back (a
        rollback, a restarted learner); those before the long window dropped, but the newest of them."""
        looks = self._looks.setdefault(lane, [])
        last = looks[-1] if looks else None
        went_back = last is not None and (
            look.cursor < last.cursor or (look.samples is not None and last.samples is not None and look.samples < last.samples)
        )
        if went_back:
            looks.clear()
        looks.append(look)
        start = look.at - self.config.learner_long_window_seconds
        while len(looks) > 1 and looks[1].at <= start:
            looks.pop(0)
        return looks

    # -- events ---------------------------------------------------------------------------------
    def _record(
        self, lane: LanePace, transition: PaceTransition | None, report: CounterReport | None, skipped: CounterReport | None,
        version: int | None, term: int | None,
    ) -> bool:
        """Record what is due for `lane`; False when this replica no longer leads (nothing more this pass)."""
        fence = term or None
        try:
            if transition is not None:
                detail = _pace_detail(lane) | {"behind_pace": self.config.learner_behind_pace, "behind_backlog": self.config.learner_behind_backlog}
                if transition.kind == CAUGHT_UP:
                    detail |= {"since": transition.since, "seconds_behind": None if transition.since is None else transition.at - transition.since}
                self.operator.record_event(transition.kind, None, detail, term=fence)
                log.warning("learner %s %s: backlog %d, pace %s", lane.lane, transition.kind, lane.pace.backlog, lane.pace.long.pace)
            if report is not None:
                detail = {
                    "lane": lane.lane, "segment": lane.lineage.segment, "count": report.count, "total": report.total, "step": report.step,
                    "exact": report.exact, "max_step_kl": self.max_step_kl, **report.figures,
                }
                self.operator.record_event(REFUSED, version, detail, term=fence)
                log.warning("learner %s: %d step(s) refused by the trust region (step KL %s)", lane.lane, report.count, report.figures.get("step_kl"))
            if skipped is not None:  # the learner's log names each reply ("not trained, it cannot be scored")
                detail = {"lane": lane.lane, "segment": lane.lineage.segment, "count": skipped.count, "total": skipped.total,
                          "step": skipped.step, "reasons": skipped.figures}
                self.operator.record_event(SKIPPED, version, detail, term=fence)
                log.warning("learner %s: %d rated repl(ies) not trained, they cannot be scored (%s)", lane.lane, skipped.count, skipped.figures)
        except StaleLeader as exc:
            log.warning("learner pace events not recorded: %s", exc)
            return False
        return True

    def _restore(self) -> None:
        """Each lane's last recorded episode and refusal report, from the event log (a lane with neither
        there is not behind)."""
        reported: dict[str, float] = {}
        skips: dict[str, float] = {}
        for _, lane in self.lanes:
            self.episodes.restore(lane, False, None)
        for e in self.operator.events(limit=SCANNED):  # oldest first: the last one of a lane wins
            lane, at = str(e.detail.get("lane")), e.created_at.timestamp()
            if e.kind in (BEHIND, CAUGHT_UP):
                self.episodes.restore(lane, e.kind == BEHIND, at)
            elif e.kind == REFUSED:
                reported[lane] = at
            elif e.kind == SKIPPED:
                skips[lane] = at
        for _, lane in self.lanes:
            self.refusals.restore(lane, reported.get(lane))
            self.skips.restore(lane, skips.get(lane))

    # -- metrics --------------------------------------------------------------------------------
    def _export(self, paced: LearnerPace) -> None:
        m = self.metrics
        windows = [(lane, name, getattr(lane.pace, name)) for lane in paced.lanes for name in ("short", "long")]
        for family, field in (
            ("learner/ratings_per_second", "arriving"), ("learner/trained_per_second", "trained"),
            ("learner/pace", "pace"), ("learner/seconds_per_rating", "seconds_per_rating"),
        ):
            series = [({"segment": lane.lineage.segment or "", "window": name}, getattr(w, field)) for lane, name, w in windows]
            m.set_series(family, [(labels, float(v)) for labels, v in series if v is not None])
        m.set_series("learner/backlog", [({"segment": lane.lineage.segment or ""}, float(lane.pace.backlog)) for lane in paced.lanes])
        m.set_series("learner/behind", [({"segment": lane.lineage.segment or ""}, float(lane.behind)) for lane in paced.lanes])
