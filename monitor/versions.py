"""The per-version table operators read: lineage, status, traffic, reward rate with its interval, and
the comparison with the parent version (two-proportion test). One typed `VersionRow` per version: the
guard decides on it, the report draws it, the admin API serialises it (at the route).

With per-segment adapters a version belongs to one lineage: the base weights' (`segment` None) or one
segment's adapters; its reward is its own responses' ratings either way (each response records the
version that served it), so the figures stay per version."""

from __future__ import annotations

from collections.abc import Mapping
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
    serving: bool  # the version the engine serves now (for an adapter: the one its segment is served)
    learner_step: int
    samples_used: int
    note: str | None
    metrics: dict[str, Any]
    responses: int
    rating_rate: float | None  # ratings per response; None without responses
    reward: Rate  # thumbs up among its ratings, with its interval
    vs_parent: Comparison | None  # this version's rate against its parent's; None without ratings on both
    segment: str | None = None  # the adapter segment whose lineage it is; None: the base weights
    keys: int = 0  # distinct keys that rated it
    votes: float = 0.0  # one vote per key: the sum of the keys' positive shares (store/records.py VersionTraffic)
    checkpoint: str = "durable"  # its weights on disk: `checkpoint_state`
    rollback_target: bool = False  # whether a rollback may serve it (servable status, checkpoint durable or being written)


BASE = "base"  # how operators name the base weights' lineage where a segment is asked for (`?segment=base`)


def lineage_of(row: VersionRow) -> str:
    """The name of a row's lineage: its segment, or "base"."""
    return BASE if row.segment is None else row.segment


def lineage(rows: list[VersionRow], name: str) -> list[VersionRow]:
    """The rows of one lineage: segment `name`'s adapters, or the base weights' for "base"."""
    return [r for r in rows if lineage_of(r) == name]


def version_table(
    versions: list[VersionRecord],
    traffic: dict[int, VersionTraffic],
    serving: int | None,
    confidence: float = 0.95,
    adapters: Mapping[str, int | None] | None = None,
) -> list[VersionRow]:
    """One row per version. `serving` is the base version the engine serves; `adapters` each segment's
    serving adapter version (None: the base serves it). Without `adapters` an adapter version is serving
    when the store says so (the publisher records it right after the engine's swap)."""
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
                serving=_serving(v, serving, adapters),
                learner_step=v.learner_step,
                samples_used=v.samples_used,
                note=v.note,
                metrics=v.metrics,
                responses=t.responses,
                rating_rate=t.ratings / t.responses if t.responses else None,
                reward=wilson(t.positive, t.ratings, confidence),
                vs_parent=compare_rates(t.positive, t.ratings, p.positive, p.ratings) if p else None,
                segment=v.segment,
                keys=t.keys,
                votes=t.votes,
                checkpoint=checkpoint_state(v),
                rollback_target=v.status.servable and checkpoint_state(v) in ROLLBACK_READABLE,
            )
        )
    return rows


ROLLBACK_READABLE = frozenset({"durable", "writing"})  # "writing": a rollback waits a bounded time for it


def checkpoint_state(v: VersionRecord) -> str:
    """Where a version's weights are, as its row says: "pruned" (retention deleted them: never served
    again), "writing" (published in memory; its learner writes the durable checkpoint within about a
    publish interval, and a rollback waits for it: issue 46.4) or "durable" (its checkpoint is written and
    its digest recorded; version 0 without one: the configured model's own directory)."""
    if v.pruned_at is not None:
        return "pruned"
    if v.segment is None and v.weights_digest is not None and not v.checkpoint_sha256:
        return "writing"
    return "durable"


def _serving(v: VersionRecord, serving: int | None, adapters: Mapping[str, int | None] | None) -> bool:
    if v.segment is None:
        return v.version == serving
    if adapters is None:
        return v.status == VersionStatus.SERVING
    return adapters.get(v.segment) == v.version
