"""The admin API on the fleet (admin keys, or the dashboard's session): the replicas registered in the
store (`GET /admin/replicas`) and the operator event log every replica writes (`GET /admin/events`)."""

from __future__ import annotations

import asyncio
from fastapi import APIRouter, Depends, Query

from liveloop.server.edge.admin.protocol import EventList, EventView, ReplicaList, ReplicaView
from liveloop.server.edge.auth import Principal, require_admin
from liveloop.server.edge.dependencies import admin_fleet as handler
from liveloop.store.operator import OperatorQueries
from liveloop.store.replicas import ReplicaRegistry

router = APIRouter(prefix="/admin")


class AdminFleet:
    """The fleet's replicas, and the operator events they record."""

    def __init__(self, registry: ReplicaRegistry, replica_id: str, down_after_seconds: float, operator: OperatorQueries):
        self.registry = registry
        self.replica_id = replica_id
        self.down_after_seconds = down_after_seconds
        self.operator = operator

    async def replicas(self) -> ReplicaList:
        rows = await asyncio.to_thread(self.registry.rows, self.down_after_seconds)
        return ReplicaList(replica=self.replica_id, data=[ReplicaView.of(r) for r in rows])

    async def events(self, limit: int) -> EventList:
        rows = await asyncio.to_thread(self.operator.events, None, limit)
        return EventList(data=[
            EventView(id=e.id, kind=e.kind, version=e.version, detail=e.detail, api_key_id=e.api_key_id, at=e.created_at.timestamp())
            for e in rows
        ])


@router.get("/replicas")
async def replicas(h: AdminFleet = Depends(handler), _: Principal = Depends(require_admin)) -> ReplicaList:
    """The fleet: every serving process registered in the store (store/replicas.py), with what it
    serves, its generations running and its health; a heartbeat older than `[server] down_after_seconds`
    is "down". `replica`: the one that answered."""
    return await h.replicas()


@router.get("/events")
async def events(h: AdminFleet = Depends(handler), limit: int = Query(200, ge=1, le=5000),
                 _: Principal = Depends(require_admin)) -> EventList:
    return await h.events(limit)
