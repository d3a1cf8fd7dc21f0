"""The per-version table operators read: lineage, status, traffic, reward rate with its interval, and
the comparison with the parent version (two-proportion test). One typed `VersionRow` per version: the
guard decides on it, the report draws it, the admin API serialises it (at the route)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from liveloop.monitor.stats import Comparison, Rate, compare_rates, wilson
from liveloop.store.records import VersionRecord, VersionTraffic
from liveloop.store.status import VersionStatus


@dataclass(frozen=True)
class VersionRow:
    version: int
    parent: int | None
    created: float  # unix seconds
    status: VersionStatus
    serving: bool  # the version the engine serves now
    learner_step: int
    samples_used: int
    note: str | None
    metrics: dict[str, Any]
    responses: int
    rating_rate: float | None  # ratings per response; None without responses
    reward: Rate  # thumbs up among its ratings, with its interval
    vs_parent: Comparison | None  # this version's rate against its parent's; None without ratings on both


def version_table(
    versions: list[VersionRecord], traffic: dict[int, VersionTraffic], serving: int | None, confidence: float = 0.95
) -> list[VersionRow]:
    rows = []
    for v in versions:
        t = traffic.get(v.version) or VersionTraffic(v.version, 0, 0, 0)
        p = traffic.get(v.parent) if v.parent is not None else None
        rows.append(
            VersionRow(
                version=v.version,
                parent=v.parent,
                created=v.created_at.timestamp(),
                status=v.status,
                serving=v.version == serving,
                learner_step=v.learner_step,
                samples_used=v.samples_used,
                note=v.note,
                metrics=v.metrics,
                responses=t.responses,
                rating_rate=t.ratings / t.responses if t.responses else None,
                reward=wilson(t.positive, t.ratings, confidence),
                vs_parent=compare_rates(t.positive, t.ratings, p.positive, p.ratings) if p else None,
            )
        )
    return rows
