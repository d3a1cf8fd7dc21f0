"""The operations handler: /healthz's status and details (each part's health and what is serving) and
/metrics' Prometheus text.

/healthz answers only once the server has started, its warm-up generation included
(server/edge/pipeline/readiness.py: its details say how it went, `warm_up`). It answers 503 when serving
cannot log (the writer thread is gone, or the store refuses commits and does not answer a ping); a
learner that is down or restarting makes it "degraded" with 200: users are still served and logged,
and the learner's ratings wait in the store. A stalled store (locked, slow) makes it "degraded" too
while the writer's oldest waiting write is older than `[store] writer_stall_seconds`
(`writer.oldest_age_seconds` says how old).

/metrics also carries the fleet's per-replica gauges, read from the replica registry at each scrape
(`liveloop_fleet_replica_version{replica}`, `_adapter_version{replica,segment}`, `_in_flight`,
`_healthy`, `_up`, `_heartbeat_age_seconds`, and `liveloop_fleet_replicas_up`), so any replica's
scrape shows the whole fleet."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from liveloop.metrics import MetricClash, Metrics
from liveloop.server.edge.dependencies import LearnerView
from liveloop.server.edge.pipeline.readiness import WarmUp
from liveloop.server.edge.pipeline.serving import Serving
from liveloop.server.engines.base import Engine
from liveloop.store import BatchWriter
from liveloop.store.replicas import ReplicaRegistry


log = logging.getLogger(__name__)

class Ops:
    """What /healthz and /metrics read, handed over at construction."""

    def __init__(self, writer: BatchWriter, ping: Callable[[], Any], engine: Engine, serving: Serving, metrics: Metrics,
                 registry: ReplicaRegistry, down_after_seconds: float, learner: LearnerView | None, warm_up: WarmUp | None):
        self.writer = writer
        self.ping = ping  # the store's: does it answer?
        self.engine = engine
        self.serving = serving
        self.metrics = metrics
        self.registry = registry
        self.down_after_seconds = down_after_seconds
        self.learner = learner
        self.warm_up = warm_up
        self._clashed: set[str] = set()  # learner metrics left out (`_export`), each logged once

    async def health(self) -> tuple[str, int, dict[str, Any]]:
        """(status, HTTP code, the details an operator may read)."""
        writer = self.writer.health()
        store_ok = writer.store_ok
        if not store_ok:  # the last commit failed: is the store back?
            try:
                await asyncio.wait_for(asyncio.to_thread(self.ping), timeout=3)
                store_ok = True
            except Exception:
                store_ok = False
        engine_ok = self.engine.healthy()
        learner = _learner_health(self.learner)
        can_log = writer.alive and store_ok
        status = "ok" if can_log and engine_ok and not writer.stalled and learner["state"] in ("running", "off") else "degraded"
        if not (can_log and engine_ok):
            status = "unavailable"
        code = 200 if status != "unavailable" else 503
        details = {
            "status": status,
            "model": self.serving.model_name,
            "engine": {"name": self.engine.name, "ok": engine_ok, "policy_version": self.engine.version},
            "policy_version": self.engine.version,
            "writer": {
                "ok": writer.alive, "queued": writer.queued, "queue_max": writer.queue_max, "failed_commits": writer.failed_commits,
                "oldest_age_seconds": round(writer.oldest_age, 3), "stalled": writer.stalled,
            },
            "store": {"ok": store_ok, "last_error": None if store_ok else writer.last_error},
            "learner": learner,
            "warm_up": None if self.warm_up is None else self.warm_up.details(),
        }
        return status, code, details

    async def _fleet_metrics(self) -> None:
        """Per-replica gauges from the replica registry: version, adapter versions, load, health, up."""
        try:
            rows = await asyncio.to_thread(self.registry.rows, self.down_after_seconds)
        except Exception:  # the store is down: /metrics still answers with what this process knows
            return
        m = self.metrics
        m.set("fleet/replicas_up", sum(r.up for r in rows))
        m.set_series("fleet/replica_up", [({"replica": r.replica_id}, float(r.up)) for r in rows])
        m.set_series("fleet/replica_healthy", [({"replica": r.replica_id}, float(r.state == "up")) for r in rows])
        m.set_series("fleet/replica_version", [({"replica": r.replica_id}, r.serving_version) for r in rows if r.serving_version is not None])
        m.set_series("fleet/replica_in_flight", [({"replica": r.replica_id}, r.in_flight) for r in rows])
        m.set_series("fleet/replica_heartbeat_age_seconds", [({"replica": r.replica_id}, r.age_seconds) for r in rows])
        m.set_series(
            "fleet/replica_adapter_version",
            [({"replica": r.replica_id, "segment": s}, v) for r in rows for s, v in r.adapter_versions.items() if v is not None],
        )

    async def metrics_text(self) -> str:
        """Every gauge, refreshed now, as Prometheus text."""
        m, writer = self.metrics, self.writer
        m.set("server/policy_version", self.engine.version)
        m.set("store/writer_batches", writer.batches)
        m.set("store/writer_rows", writer.rows)
        m.set("store/writer_commit_seconds", writer.commit_seconds)
        m.set("store/writer_queued", writer.health().queued)
        m.set("server/generations_running", self.serving.admission.total)
        m.set("store/writer_rejected", writer.rejected)
        m.set("store/writer_failed_commits", writer.failed_commits)
        m.set("store/writer_timed_out", writer.timed_out)
        m.set("store/writer_oldest_age_seconds", writer.oldest_age())
        await self._fleet_metrics()
        if self.learner is not None:
            await self._learner_metrics()
        return m.render()

    async def _learner_metrics(self) -> None:
        assert self.learner is not None
        m = self.metrics
        try:
            status = await asyncio.to_thread(self.learner.status)
        except Exception:  # the learner is busy or gone: serve the other metrics anyway
            status = None
        if status is not None:  # any learner's totals; a plain learner's version, cursor and last metrics too
            one = status.single
            keys = ("version", "cursor") if one is not None else ()
            for key in (*keys, "step", "samples", "skipped_steps", "idle_fraction"):
                m.set(f"learner/{key}", float(getattr(status, key)))
            for key, value in (one.metrics if one is not None else {}).items():
                self._export(key, float(value))
            if one is None:  # lanes (the default's shared adapter, segments): each lane's own under lane/, by segment
                for lane in status.lanes:
                    m.set("lane/version", float(lane.version), segment=lane.segment)
                    for key, value in lane.metrics.items():  # lane/learner/step_kl{segment="shared"}, ...
                        self._export(f"lane/{key}", float(value), segment=lane.segment)

    def _export(self, name: str, value: float, **labels: str) -> None:
        """One of the learner's figures as a gauge. A name the server already writes as another kind (or
        with other labels) is left out, logged once, never a failed /metrics."""
        try:
            self.metrics.set(name, value, **labels)
        except MetricClash as exc:
            if name not in self._clashed:
                self._clashed.add(name)
                log.warning("the learner's metric %s is not exported: %s", name, exc)


def _learner_health(learner: LearnerView | None) -> dict[str, Any]:
    if learner is None:
        return {"state": "off"}
    health = learner.health()
    return {"state": health.state, "restarts": health.restarts, "last_error": health.last_error}
