"""GET /v1/versions' handler: the policy versions, a page at a time (OpenAI's list form: `limit`,
`after`, `order`; `has_more`), each with the live replicas serving it (`replicas`, from the replica
registry)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from liveloop.store.replicas import ReplicaRegistry, serving_by_version
from liveloop.store.versions import VersionQueries


class ServingVersions:
    """The versions' page, with the fleet's view of who serves each."""

    def __init__(self, versions: VersionQueries, registry: ReplicaRegistry, down_after_seconds: float, serving: Callable[[], int]):
        self.versions = versions
        self.registry = registry
        self.down_after_seconds = down_after_seconds
        self.serving = serving  # the version this replica's engine serves now

    async def page(self, limit: int, after: int | None, descending: bool) -> dict[str, Any]:
        rows = await asyncio.to_thread(self.versions.versions_page, after, limit + 1, descending)
        page = rows[:limit]
        fleet = serving_by_version(await asyncio.to_thread(self.registry.rows, self.down_after_seconds))
        return {
            "object": "list",
            "serving": self.serving(),
            "data": [
                {
                    "version": v.version,
                    "parent": v.parent,
                    "segment": v.segment,  # the adapter segment whose lineage it is; None: the base weights
                    "created": int(v.created_at.timestamp()),
                    "status": v.status,
                    "learner_step": v.learner_step,
                    "samples_used": v.samples_used,
                    "metrics": v.metrics,
                    "note": v.note,
                    "replicas": fleet.get(v.version, []),  # the live replicas serving it (store/replicas.py)
                }
                for v in page
            ],
            "first_id": page[0].version if page else None,
            "last_id": page[-1].version if page else None,
            "has_more": len(rows) > limit,
        }
