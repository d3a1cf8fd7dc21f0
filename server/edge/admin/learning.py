"""The admin API on learning (admin keys, or the dashboard's session): pause and resume (the learner,
or with `segment` one segment's lane), the drift monitor's state, the learning view (`GET
/admin/learning`: per segment and version, reward, moving reward and the served rate of the declared
behaviours, monitor/learning.py), the server's statistics and the co-located learner's status with its
pace."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from liveloop.monitor.learning import DEFAULT_WINDOW, MAX_REPLIES, MAX_WINDOW, read_segment
from liveloop.monitor.versions import BASE
from liveloop.segments import BASE as BASE_LINEAGE
from liveloop.segments import Lineage
from liveloop.server.control.activator import Activator
from liveloop.server.control.operations import Operations
from liveloop.server.edge.admin import views as admin_json
from liveloop.server.edge.admin.protocol import (
    DriftView, LearnerStatusView, LearningReport, LearningSwitch, PauseRequest, StatsView,
)
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.body import parse_body
from liveloop.server.edge.dependencies import LearnerView
from liveloop.server.edge.dependencies import admin_learning as handler
from liveloop.server.engines.base import Engine
from liveloop.store.feedback import FeedbackQueries
from liveloop.store.release import ReleaseQueries

router = APIRouter(prefix="/admin")


class AdminLearning:
    """What operators read and switch of the learning: its pause, its drift, its reward, its learner."""

    def __init__(self, operations: Operations, activator: Activator, engine: Engine, tokenizer: Any, model_name: str,
                 release: ReleaseQueries, feedback: FeedbackQueries, learner: LearnerView | None, started_at: int):
        self.operations = operations
        self.activator = activator
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.release = release
        self.feedback = feedback
        self.learner = learner
        self.started_at = started_at

    async def set_paused(self, paused: bool, req: PauseRequest, principal: Principal) -> LearningSwitch:
        return admin_json.learning(await self.operations.set_paused(paused, principal.key_id, req.reason, Lineage(req.segment)))

    async def drift(self, since: float | None) -> DriftView:
        monitor = self.operations.monitor
        state, series = await asyncio.to_thread(lambda: (monitor.state(), monitor.series(since)))
        return DriftView(window_seconds=monitor.config.window_seconds, **state, series=[admin_json.bucket(b) for b in series])

    async def learning(self, segment: str | None, window: int) -> LearningReport:
        activator = self.activator
        lineages: list[Lineage]
        if segment is None:
            lineages = [BASE_LINEAGE, *(Lineage(s) for s in activator.segments)]
        elif segment == BASE:
            lineages = [BASE_LINEAGE]
        else:
            activator.lane(Lineage(segment))  # UnknownSegment: 404
            lineages = [Lineage(segment)]
        behaviours = self.operations.config.behaviours
        confidence = self.operations.config.confidence

        def decode(ids: list[list[int]]) -> list[str]:
            return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

        def read() -> list:
            views = [read_segment(self.release, decode, lineage, behaviours, window, confidence, MAX_REPLIES) for lineage in lineages]
            # with adapters every new response has a segment: the base row only where older ones have none
            keep = [not lineage.is_base or segment == BASE or not activator.segments or v.responses for v, lineage in zip(views, lineages)]
            return [v for v, k in zip(views, keep) if k]

        views = await asyncio.to_thread(read)
        return LearningReport(
            window=window, max_responses=MAX_REPLIES, behaviours=list(behaviours), data=[admin_json.segment_learning(v) for v in views],
        )

    async def stats(self) -> StatsView:
        counts = await asyncio.to_thread(self.feedback.counts)
        await self.activator.changes.idle()  # "serving" below is read with no await between: settled
        return StatsView(
            serving=self.engine.version,
            engine=self.engine.name,
            model=self.model_name,
            uptime_seconds=int(time.time()) - self.started_at,
            learning_paused=await self.operations.paused(),
            counts=counts,
            rating_rate=counts["feedback"] / counts["responses"] if counts["responses"] else None,
            learner=await self.learner_status(),
        )

    async def learner_status(self, **head: Any) -> LearnerStatusView:
        """The learner's health and status; `head`: keys first (`object`)."""
        learner = self.learner
        if learner is None:
            return LearnerStatusView(**head, running=False, state="off", pace=None)
        pace = admin_json.learner_pace(self.operations.learner_pace())  # measured on the store too while the learner is down
        health = dataclasses.asdict(learner.health())
        if health["state"] != "running":
            return LearnerStatusView.model_validate({**head, "running": False, **health, "pace": pace})
        try:
            status = await asyncio.to_thread(learner.status)
        except Exception as exc:  # busy, or it died since: say so rather than fail the page
            return LearnerStatusView.model_validate({**head, "running": False, **health, "error": str(exc)[:200], "pace": pace})
        return LearnerStatusView.model_validate({**head, "running": True, **health, **status.as_dict(), "pace": pace})


@router.post("/learning/pause")
async def pause(request: Request, h: AdminLearning = Depends(handler), principal: Principal = Depends(require_admin)) -> LearningSwitch:
    """Pause the learner, or with `segment` that segment's lane only (it neither trains nor activates)."""
    return await h.set_paused(True, await parse_body(request, PauseRequest, empty_ok=True), principal)


@router.post("/learning/resume")
async def resume(request: Request, h: AdminLearning = Depends(handler), principal: Principal = Depends(require_admin)) -> LearningSwitch:
    return await h.set_paused(False, await parse_body(request, PauseRequest, empty_ok=True), principal)


@router.get("/drift")
async def drift(
    h: AdminLearning = Depends(handler), since: float | None = Query(None, description="unix seconds: buckets from then on"),
    _: Principal = Depends(require_admin),
) -> DriftView:
    """The detectors' state, alarms, per-segment rates and the reward series (time buckets)."""
    return await h.drift(since)


@router.get("/learning")
async def learning(
    h: AdminLearning = Depends(handler),
    segment: str | None = Query(None, min_length=1, max_length=256, description=f"one segment (`{BASE}`: responses without one)"),
    window: int = Query(DEFAULT_WINDOW, ge=1, le=MAX_WINDOW, description="ratings in the moving reward"),
    _: Principal = Depends(require_admin),
) -> LearningReport:
    """Per segment (the configured adapter segments, and `base` where responses were recorded without
    one) and per version that served it: ratings, reward with its interval, the moving reward over the
    last `window` ratings and the served rate of each `[monitor] behaviours` rule, over the segment's
    newest responses (at most MAX_REPLIES). An unknown segment is a 404."""
    return await h.learning(segment, window)


@router.get("/stats")
async def stats(h: AdminLearning = Depends(handler), _: Principal = Depends(require_admin)) -> StatsView:
    return await h.stats()


@router.get("/learner")
async def learner_status(_: Principal = Depends(require_admin), h: AdminLearning = Depends(handler)) -> LearnerStatusView:
    """The co-located learner's state: version, cursor, steps, idle fraction, last metrics, and its pace
    (`pace`: each lane's arrival and training rates, backlog, seconds per rating, the behind and
    refused-step alarms; server/control/learner_watch.py)."""
    return await h.learner_status(object="learner")
