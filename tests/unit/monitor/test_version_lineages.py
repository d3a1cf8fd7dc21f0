"""The version table with per-segment adapters: each row names its lineage, an adapter version is
"serving" when its segment is served by it (not when the base version equals it), reward stays the
version's own, and `lineage` keeps one lineage ("base": the base weights')."""

from datetime import datetime, timezone

import pytest

from liveloop.monitor.versions import BASE, lineage, lineage_of, version_table
from liveloop.store.records import VersionRecord, VersionTraffic

NOW = datetime.now(timezone.utc)
VERSIONS = [
    VersionRecord(0, None, NOW, "/base", None, 0, 0, status="serving"),
    VersionRecord(1, 0, NOW, "/a1", None, 1, 1, status="retired", segment="cozy"),
    VersionRecord(2, 1, NOW, "/a2", None, 2, 2, status="serving", segment="cozy"),
    VersionRecord(3, 0, NOW, "/n1", None, 1, 1, status="published", segment="night"),
]
TRAFFIC = {0: VersionTraffic(0, 10, 4, 1), 1: VersionTraffic(1, 5, 5, 2), 2: VersionTraffic(2, 6, 6, 6)}


def test_rows_name_their_lineage_and_keep_their_own_reward():
    rows = version_table(VERSIONS, TRAFFIC, serving=0, adapters={"cozy": 2, "night": None})
    assert [(r.version, r.segment, r.serving) for r in rows] == [(0, None, True), (1, "cozy", False), (2, "cozy", True), (3, "night", False)]
    a2 = rows[2]
    assert (a2.reward.n, a2.reward.successes) == (6, 6) and a2.vs_parent.difference == pytest.approx(1.0 - 2 / 5)
    assert [lineage_of(r) for r in rows] == [BASE, "cozy", "cozy", "night"]


def test_serving_adapters_follow_the_engine_when_given_else_the_store():
    # the engine serves cozy v1 again (a rollback the store has not recorded yet): the engine's word counts
    rows = version_table(VERSIONS, TRAFFIC, serving=0, adapters={"cozy": 1})
    assert [r.version for r in rows if r.serving] == [0, 1]
    rows = version_table(VERSIONS, TRAFFIC, serving=0)
    assert [r.version for r in rows if r.serving] == [0, 2]
    # the base's serving number never marks an adapter row serving
    rows = version_table(VERSIONS, TRAFFIC, serving=2, adapters={})
    assert [r.version for r in rows if r.serving] == []


def test_lineage_keeps_one():
    rows = version_table(VERSIONS, TRAFFIC, serving=0)
    assert [r.version for r in lineage(rows, "cozy")] == [1, 2]
    assert [r.version for r in lineage(rows, BASE)] == [0]
    assert lineage(rows, "overflow") == []
