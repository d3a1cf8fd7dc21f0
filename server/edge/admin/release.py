"""The release gate's admin API: `GET /admin/release` (the mode of each lineage, the base lineage's
candidate with its rated traffic against the live version's, its evaluation state and the gate's
verdict now, and under `lineages` the same for each gated segment's adapter lineage, with the adapter
version serving it); `GET /admin/versions/{v}/evaluation` (a version's latest evaluation: each check's value
against the live version's and the base model's, its bounds, pass or fail) and `GET /admin/evaluations`
(the latest evaluation of each recent version, for the dashboard). Admin keys or the dashboard's
session."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Query

from liveloop.server.control.activator import Activator
from liveloop.server.control.gate import CandidateState, ReleaseGate, ReleaseState
from liveloop.server.edge.admin.protocol import (
    CandidateView, DecisionView, EvaluationList, EvaluationView, LineageView, ReleaseView, TrafficView,
)
from liveloop.server.edge.admin.views import settled_body
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.dependencies import admin_release as handler
from liveloop.server.edge.errors import APIError
from liveloop.server.engines.base import Engine
from liveloop.store.records import EvaluationRecord, VersionTraffic
from liveloop.store.release import ReleaseQueries
from liveloop.store.versions import VersionQueries

router = APIRouter(prefix="/admin")


def _traffic(t: VersionTraffic) -> TrafficView:
    return TrafficView(
        version=t.version, responses=t.responses, ratings=t.ratings, positive=t.positive,
        rate=t.positive / t.ratings if t.ratings else None,
    )


def _candidate(c: CandidateState | None) -> CandidateView | None:
    if c is None:
        return None
    d = c.decision
    return CandidateView(
        version=c.version, status=str(c.status), loaded=c.loaded, traffic=_traffic(c.traffic), live=_traffic(c.live_traffic),
        evaluation=c.evaluation, decision=None if d is None else DecisionView(action=d.action, reason=d.reason, p_worse=d.p_worse),
    )


def release_json(state: ReleaseState | None, serving: int) -> ReleaseView:
    if state is None:  # no gate: immediate mode with the evaluation off
        return ReleaseView(mode="immediate", segments={}, serving=serving, candidate=None, evaluating=None, lineages={}, gate=False)
    lineages = {
        lineage.segment: LineageView(mode=lineage.mode, serving=lineage.serving, candidate=_candidate(lineage.candidate))
        for lineage in state.lineages
    }
    return ReleaseView(
        mode=state.mode, segments=dict(state.segment_modes), configured_segments=dict(state.segment_modes),
        canary_fraction=state.canary_fraction, serving=state.serving, candidate=_candidate(state.candidate),
        evaluating=state.evaluating, lineages=lineages, gate=True,
    )


# -- evaluations (the evaluation suite's results, release/evaluation.py) -----------------------------
def evaluation_json(e: EvaluationRecord) -> EvaluationView:
    return EvaluationView(
        version=e.version, live_version=e.live_version, passed=e.passed, failed=[c["name"] for c in e.checks if not c.get("passed")],
        checks=e.checks, seconds=e.seconds, engine_seconds=e.engine_seconds, created=e.created_at.timestamp(),
    )


class AdminRelease:
    """How versions reach users: the release gate's state and the evaluations of versions."""

    def __init__(self, gate: ReleaseGate | None, activator: Activator, engine: Engine, release: ReleaseQueries, versions: VersionQueries):
        self.gate = gate  # None: no gate (immediate mode with the evaluation off)
        self.activator = activator
        self.engine = engine
        self.release = release
        self.versions = versions

    async def state(self) -> ReleaseView:
        gate = self.gate

        async def read() -> ReleaseView:
            snapshot = await asyncio.to_thread(gate.state) if gate is not None else None
            return release_json(snapshot, self.engine.version)

        return settled_body(await self.activator.changes.read(read))

    async def evaluation(self, version: int) -> EvaluationView:
        if not 0 <= version < 2**31:
            raise APIError(400, "version: out of range", param="version")
        record, found = await asyncio.to_thread(lambda: (self.release.evaluation(version), self.versions.get_version(version)))
        if found is None:
            raise APIError(404, f"no policy version {version}", param="version", code="version_not_found")
        if record is None:
            raise APIError(404, f"version {version} has not been evaluated (yet: a candidate's evaluation runs in the background; "
                           "none runs with [release.evaluation] enabled = false)", param="version", code="evaluation_not_found")
        return evaluation_json(record)

    async def evaluations(self, limit: int) -> EvaluationList:
        def read() -> dict:
            versions = [v.version for v in self.versions.versions_page(None, limit, descending=True)]
            return self.release.evaluations(versions)

        found = await asyncio.to_thread(read)
        return EvaluationList(data=[evaluation_json(found[v]) for v in sorted(found, reverse=True)])


@router.get("/release")
async def release(h: AdminRelease = Depends(handler), _: Principal = Depends(require_admin)) -> ReleaseView:
    """How versions reach users now: the mode, the candidate (traffic vs live, evaluation, verdict)."""
    return await h.state()


@router.get("/versions/{version}/evaluation")
async def evaluation(version: int, h: AdminRelease = Depends(handler), _: Principal = Depends(require_admin)) -> EvaluationView:
    """The latest evaluation of `version`: each check's value, the live version's and the base model's,
    its bounds and whether it held. 404 version_not_found / evaluation_not_found."""
    return await h.evaluation(version)


@router.get("/evaluations")
async def evaluations(
    h: AdminRelease = Depends(handler), limit: int = Query(50, ge=1, le=500, description="the newest versions to look at"),
    _: Principal = Depends(require_admin),
) -> EvaluationList:
    """The latest evaluation of each of the newest `limit` versions that has one (the dashboard's
    version table), newest version first."""
    return await h.evaluations(limit)
