"""The admin API's JSON: the typed results of the activator, `Operations` and the monitor turned into
the dicts the admin routes return (the dashboard, `liveloop versions` and the tests read these keys:
change them only with their readers).

Per-segment adapters: every version row names its lineage (`segment`, None for the base weights');
a rollback or pause/resume result carries `segment` when it moved one segment's lineage (without
adapters the results are the keys they always were); `SegmentState` is one row of `GET /admin/adapters`."""

from __future__ import annotations

import dataclasses
from typing import Any

from liveloop.monitor.drift import Bucket
from liveloop.monitor.learning import SegmentLearning
from liveloop.monitor.versions import VersionRow
from liveloop.server.control.learner_watch import LanePace, LearnerPace
from liveloop.server.control.operations import LearningState, WeightsImported
from liveloop.server.control.settled import Read
from liveloop.server.control.activator import RollbackResult, SwapResult
from liveloop.store import VersionStatus


@dataclasses.dataclass(frozen=True)
class SegmentState:
    """One segment's adapter lineage as operators see it."""

    segment: str
    learner: str  # its lane's cursor and pause name (`sao:cozy`)
    serving: int | None  # the adapter version serving it; None: the base weights
    policy_version: int  # what its responses record now: `serving`, or the base version
    paused: bool  # its lane neither trains nor activates
    versions: list[VersionRow]  # its adapter versions, oldest first


def swap(result: SwapResult) -> dict[str, Any]:
    return {"object": "policy_version", **dataclasses.asdict(result)}


def imported(result: WeightsImported) -> dict[str, Any]:
    """An operator's checkpoint serving: the swap's keys, then the copy's digest and what the import
    took from the serving model (`completed`) or did not copy (`left_behind`)."""
    return swap(result.swap) | {
        "checkpoint_sha256": result.checkpoint_sha256, "completed": list(result.completed), "left_behind": list(result.left_behind),
    }


def _without_null_segment(fields: dict[str, Any]) -> dict[str, Any]:
    """Drop `segment` when no segment was named: without adapters, the keys clients always got."""
    if fields.get("segment") is None:
        fields.pop("segment", None)
    return fields


def rollback(result: RollbackResult) -> dict[str, Any]:
    return {"object": "rollback", **_without_null_segment(dataclasses.asdict(result))}


def learning(state: LearningState) -> dict[str, Any]:
    return {"object": "learning", **_without_null_segment(dataclasses.asdict(state))}


def adapters(mode: str, base: int, segments: list[SegmentState]) -> dict[str, Any]:
    return {"object": "adapters", "adapters": mode, "base_version": base, "segments": [segment(s) for s in segments]}


def segment(state: SegmentState) -> dict[str, Any]:
    latest = state.versions[-1] if state.versions else None
    return {
        "segment": state.segment,
        "learner": state.learner,
        "serving": state.serving,
        "policy_version": state.policy_version,
        "paused": state.paused,
        "versions": len(state.versions),
        "latest": None if latest is None else {
            "version": latest.version,
            "status": latest.status.value,
            "parent": latest.parent,
            "responses": latest.responses,
            "reward": latest.reward.as_dict(),
            "vs_parent": None if latest.vs_parent is None else dataclasses.asdict(latest.vs_parent),
        },
    }


def version(row: VersionRow) -> dict[str, Any]:
    return {
        "version": row.version,
        "parent": row.parent,
        "segment": row.segment,
        "created": row.created,
        "status": row.status.value,
        "serving": row.serving,
        "learner_step": row.learner_step,
        "samples_used": row.samples_used,
        "note": row.note,
        "metrics": row.metrics,
        "responses": row.responses,
        "rating_rate": row.rating_rate,
        "reward": row.reward.as_dict(),
        "vs_parent": None if row.vs_parent is None else dataclasses.asdict(row.vs_parent),
        "checkpoint": row.checkpoint,  # durable | writing | pruned (monitor/versions.py `checkpoint_state`)
        "rollback_target": row.rollback_target,
    }


def segment_learning(view: SegmentLearning) -> dict[str, Any]:
    """One segment of `GET /admin/learning` (the dashboard's learning panel)."""
    return {
        "segment": view.segment, "window": view.window, "responses": view.responses, "ratings": view.ratings,
        "versions": [
            {
                "version": v.version, "responses": v.responses, "reward": v.reward.as_dict(),
                "behaviours": {b.behaviour: b.served.as_dict() for b in v.behaviours},
            }
            for v in view.versions
        ],
        "moving": [{"index": p.index, "version": p.version, "reward": p.reward} for p in view.moving],
    }


def learner_pace(paced: LearnerPace | None) -> dict[str, Any] | None:
    """The learner's pace at the last check (`GET /admin/learner`'s `pace`, the dashboard's pace panel);
    None before the first check, or with no learner to watch."""
    if paced is None:
        return None
    return {
        "at": paced.at, "short_seconds": paced.short_seconds, "long_seconds": paced.long_seconds,
        "behind_pace": paced.behind_pace, "behind_backlog": paced.behind_backlog, "behind": paced.behind,
        "lanes": [lane_pace(lane) for lane in paced.lanes],
    }


def lane_pace(lane: LanePace) -> dict[str, Any]:
    return {
        "segment": lane.segment, "lane": lane.lane, "cursor": lane.cursor, "answered": lane.answered, "paused": lane.paused,
        "behind": lane.behind, "behind_since": lane.behind_since, "refused_steps": lane.refused_steps, **lane.pace.as_dict(),
    }


def bucket(b: Bucket) -> dict[str, Any]:
    return {"t": b.t, **b.reward.as_dict()}


def statuses() -> list[dict[str, Any]]:
    """Every version status with what it means and whether a version in it can be served again."""
    return [{"status": s.value, "servable": s.servable, "description": s.description} for s in VersionStatus]


def settled_body(done: Read[dict[str, Any]]) -> dict[str, Any]:
    """An admin view read between changes of what serves (server/control/settled.py), saying whether it
    was: `settled` False when a change overlapped every try and the view may mix one change's two sides
    (the next read shows it resolved)."""
    return {**done.value, "settled": done.settled}
