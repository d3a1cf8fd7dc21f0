"""The admin API's JSON: the typed results of the publisher, `Operations` and the monitor turned into
the dicts the admin routes return (the dashboard, `liveloop versions` and the tests read these keys:
change them only with their readers)."""

from __future__ import annotations

import dataclasses
from typing import Any

from liveloop.monitor.drift import Bucket
from liveloop.monitor.versions import VersionRow
from liveloop.server.operations import KeyRow, LearningState
from liveloop.server.publisher import RollbackResult, SwapResult
from liveloop.store import VersionStatus


def swap(result: SwapResult) -> dict[str, Any]:
    return {"object": "policy_version", **dataclasses.asdict(result)}


def rollback(result: RollbackResult) -> dict[str, Any]:
    return {"object": "rollback", **dataclasses.asdict(result)}


def learning(state: LearningState) -> dict[str, Any]:
    return {"object": "learning", **dataclasses.asdict(state)}


def version(row: VersionRow) -> dict[str, Any]:
    return {
        "version": row.version,
        "parent": row.parent,
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
    }


def bucket(b: Bucket) -> dict[str, Any]:
    return {"t": b.t, **b.reward.as_dict()}


def key(row: KeyRow) -> dict[str, Any]:
    k, d = row.state, row.disagreement
    return {
        "key_id": k.key_id,
        "quarantined": k.quarantined,
        "reason": k.reason,
        "ratings": k.ratings,
        "forgotten_at": k.forgotten_at.timestamp() if k.forgotten_at else None,
        "disagreement": None if d is None else {"n": d.n, "disagreements": d.disagreements, "expected": d.expected, "z": d.z},
    }


def statuses() -> list[dict[str, Any]]:
    """Every version status with what it means and whether a version in it can be served again."""
    return [{"status": s.value, "servable": s.servable, "description": s.description} for s in VersionStatus]
