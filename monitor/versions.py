"""The per-version table operators read: lineage, status, traffic, reward rate with its interval, and
the comparison with the parent version (two-proportion test)."""

from __future__ import annotations

from typing import Any

from liveloop.monitor.stats import compare_rates, wilson
from liveloop.store.records import VersionRecord, VersionTraffic


def version_table(
    versions: list[VersionRecord], traffic: dict[int, VersionTraffic], serving: int | None, confidence: float = 0.95
) -> list[dict[str, Any]]:
    rows = []
    for v in versions:
        t = traffic.get(v.version) or VersionTraffic(v.version, 0, 0, 0)
        row: dict[str, Any] = {
            "version": v.version,
            "parent": v.parent,
            "created": v.created_at.timestamp(),
            "status": v.status,
            "serving": v.version == serving,
            "learner_step": v.learner_step,
            "samples_used": v.samples_used,
            "note": v.note,
            "metrics": v.metrics,
            "responses": t.responses,
            "rating_rate": t.ratings / t.responses if t.responses else None,
            "reward": wilson(t.positive, t.ratings, confidence).as_dict(),
            "vs_parent": None,
        }
        p = traffic.get(v.parent) if v.parent is not None else None
        c = compare_rates(t.positive, t.ratings, p.positive, p.ratings) if p else None
        if c is not None:
            row["vs_parent"] = {"difference": c.difference, "z": c.z, "p_two_sided": c.p_two_sided, "p_worse": c.p_worse}
        rows.append(row)
    return rows
