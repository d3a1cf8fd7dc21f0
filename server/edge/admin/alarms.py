"""`GET /admin/alarms` (admin keys, or the dashboard's session): the reward-hacking alarms on the live
stream (server/control/alarms.py): the settings they run with, the recent `reward_hacking` operator events, and
the latest judgement of each judged version (its reward gain over its reference, each trait's share
of it, the traits that alarm, and its stored evaluation of the same traits)."""

from __future__ import annotations

import asyncio
from fastapi import APIRouter, Depends, Query

from liveloop.server.control.operations import Operations
from liveloop.server.edge.admin.protocol import AlarmEvent, AlarmList, AlarmSettings
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.dependencies import admin_alarms as handler
from liveloop.store.operator import OperatorQueries

router = APIRouter(prefix="/admin")

SCANNED = 5000  # newest operator events looked through for reward_hacking ones


class AdminAlarms:
    """The reward-hacking alarms as operators read them."""

    def __init__(self, operations: Operations, operator: OperatorQueries):
        self.operations = operations
        self.operator = operator

    async def listed(self, limit: int) -> AlarmList:
        operations = self.operations
        alarms = operations.alarms
        events = [e for e in await asyncio.to_thread(self.operator.events, None, SCANNED) if e.kind == "reward_hacking"][-limit:]
        settings = None
        if alarms is not None:
            c = alarms.config
            settings = AlarmSettings(
                traits=list(c.traits), min_ratings=c.min_ratings, min_gain=c.min_gain, explained_share=c.explained_share,
                auto_hold=c.auto_hold, check_seconds=c.check_seconds,
            )
        return AlarmList(
            enabled=alarms is not None,
            settings=settings,
            events=[
                AlarmEvent(id=e.id, version=e.version, trait=e.detail.get("trait"), detail=e.detail, at=e.created_at.timestamp())
                for e in reversed(events)
            ],
            data=[v.detail() for v in operations.hacking()],
        )


@router.get("/alarms")
async def reward_hacking(h: AdminAlarms = Depends(handler), limit: int = Query(100, ge=1, le=1000), _: Principal = Depends(require_admin)) -> AlarmList:
    return await h.listed(limit)
