"""The admin API's JSON: the typed results of the activator, `Operations` and the monitor turned into
the response models of server/edge/admin/protocol.py that the admin routes return (the dashboard,
`liveloop versions` and the tests read these keys: change them only with their readers).

Per-segment adapters: every version row names its lineage (`segment`, None for the base weights');
a rollback or pause/resume result carries `segment` when it moved one segment's lineage (without
adapters the results are the keys they always were); `SegmentState` is one row of `GET /admin/adapters`."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from pydantic import BaseModel

from liveloop.monitor.drift import Bucket
from liveloop.monitor.learning import SegmentLearning
from liveloop.monitor.stats import Comparison, Rate
from liveloop.monitor.versions import VersionRow
from liveloop.server.control.learner_watch import LanePace, LearnerPace
from liveloop.server.control.pace import WindowPace
from liveloop.server.control.operations import LearningState, WeightsImported
from liveloop.server.control.settled import Read
from liveloop.server.control.activator import RollbackResult
from liveloop.server.edge.admin.protocol import (
    AdaptersView, BucketView, ComparisonView, Imported, LanePaceView, LatestVersion, LearnerPaceView, LearningSwitch,
    MovingPointView, RewardView, RolledBack, SegmentLearningView, SegmentView, StatusList, StatusView, VersionLearningView,
    VersionView, WindowPaceView,
)
from liveloop.store import VersionStatus

B = TypeVar("B", bound=BaseModel)


@dataclasses.dataclass(frozen=True)
class SegmentState:
    """One segment's adapter lineage as operators see it."""

    segment: str
    learner: str  # its lane's cursor and pause name (`sao:cozy`)
    serving: int | None  # the adapter version serving it; None: the base weights
    policy_version: int  # what its responses record now: `serving`, or the base version
    paused: bool  # its lane neither trains nor activates
    versions: list[VersionRow]  # its adapter versions, oldest first


def reward(rate: Rate) -> RewardView:
    return RewardView(n=rate.n, positive=rate.successes, rate=rate.value, low=rate.low, high=rate.high)


def _comparison(c: Comparison | None) -> ComparisonView | None:
    return None if c is None else ComparisonView(difference=c.difference, z=c.z, p_two_sided=c.p_two_sided, p_worse=c.p_worse)


def imported(result: WeightsImported) -> Imported:
    """An operator's checkpoint serving: the swap's keys, then the copy's digest and what the import
    took from the serving model (`completed`) or did not copy (`left_behind`)."""
    s = result.swap
    return Imported(
        version=s.version, parent=s.parent, swap_ms=s.swap_ms, held_ms=s.held_ms, checkpoint_sha256=result.checkpoint_sha256,
        completed=list(result.completed), left_behind=list(result.left_behind),
    )


def _segment_named(segment: str | None) -> dict[str, Any]:
    """`segment` only when one was named: without adapters, the keys clients always got."""
    return {} if segment is None else {"segment": segment}


def rollback(r: RollbackResult) -> RolledBack:
    return RolledBack(
        version=r.version, previous=r.previous, rolled_back=list(r.rolled_back), swap_ms=r.swap_ms, held_ms=r.held_ms,
        **_segment_named(r.lineage.segment),
    )


def learning(state: LearningState) -> LearningSwitch:
    return LearningSwitch(learner=state.learner, paused=state.paused, changed=state.changed, **_segment_named(state.lineage.segment))


def adapters(mode: str, base: int, segments: list[SegmentState]) -> AdaptersView:
    return AdaptersView(adapters=mode, base_version=base, segments=[segment(s) for s in segments])


def segment(state: SegmentState) -> SegmentView:
    latest = state.versions[-1] if state.versions else None
    return SegmentView(
        segment=state.segment, learner=state.learner, serving=state.serving, policy_version=state.policy_version,
        paused=state.paused, versions=len(state.versions),
        latest=None if latest is None else LatestVersion(
            version=latest.version, status=latest.status.value, parent=latest.parent, responses=latest.responses,
            reward=reward(latest.reward), vs_parent=_comparison(latest.vs_parent),
        ),
    )


def version(row: VersionRow) -> VersionView:
    return VersionView(
        version=row.version, parent=row.parent, segment=row.segment, created=row.created, status=row.status.value,
        serving=row.serving, learner_step=row.learner_step, samples_used=row.samples_used, note=row.note,
        metrics=row.metrics, responses=row.responses, rating_rate=row.rating_rate, reward=reward(row.reward),
        vs_parent=_comparison(row.vs_parent), checkpoint=row.checkpoint, rollback_target=row.rollback_target,
    )


def segment_learning(view: SegmentLearning) -> SegmentLearningView:
    """One segment of `GET /admin/learning` (the dashboard's learning panel)."""
    return SegmentLearningView(
        segment=view.segment, window=view.window, responses=view.responses, ratings=view.ratings,
        versions=[
            VersionLearningView(
                version=v.version, responses=v.responses, reward=reward(v.reward),
                behaviours={b.behaviour: reward(b.served) for b in v.behaviours},
            )
            for v in view.versions
        ],
        moving=[MovingPointView(index=p.index, version=p.version, reward=p.reward) for p in view.moving],
    )


def learner_pace(paced: LearnerPace | None) -> LearnerPaceView | None:
    """The learner's pace at the last check (`GET /admin/learner`'s `pace`, the dashboard's pace panel);
    None before the first check, or with no learner to watch."""
    if paced is None:
        return None
    return LearnerPaceView(
        at=paced.at, short_seconds=paced.short_seconds, long_seconds=paced.long_seconds, behind_pace=paced.behind_pace,
        behind_backlog=paced.behind_backlog, behind=paced.behind, lanes=[lane_pace(lane) for lane in paced.lanes],
    )


def _window(w: WindowPace) -> WindowPaceView:
    return WindowPaceView(
        seconds=w.seconds, arriving=w.arriving, trained=w.trained, pace=w.pace, seconds_per_rating=w.seconds_per_rating,
        measured_seconds=w.measured_seconds, full=w.full,
    )


def lane_pace(lane: LanePace) -> LanePaceView:
    pace = lane.pace
    return LanePaceView(
        segment=lane.lineage.segment, lane=lane.lane, cursor=lane.cursor, answered=lane.answered, paused=lane.paused,
        behind=lane.behind, behind_since=lane.behind_since, refused_steps=lane.refused_steps, backlog=pace.backlog,
        backlog_capped=pace.backlog_capped, short=_window(pace.short), long=_window(pace.long),
    )


def bucket(b: Bucket) -> BucketView:
    r = b.reward
    return BucketView(t=b.t, n=r.n, positive=r.successes, rate=r.value, low=r.low, high=r.high)


def statuses() -> StatusList:
    """Every version status with what it means and whether a version in it can be served again."""
    return StatusList(data=[StatusView(status=s.value, servable=s.servable, description=s.description) for s in VersionStatus])


def settled_body(done: Read[B]) -> B:
    """An admin view read between changes of what serves (server/control/settled.py), saying whether it
    was: `settled` False when a change overlapped every try and the view may mix one change's two sides
    (the next read shows it resolved)."""
    return done.value.model_copy(update={"settled": done.settled})
