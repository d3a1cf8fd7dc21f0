from datetime import datetime, timezone

import pytest

from liveloop.monitor.versions import version_table
from liveloop.store import VersionStatus
from liveloop.store.records import VersionRecord, VersionTraffic


def test_version_table_lineage_rates_and_parent_comparison():
    now = datetime.now(timezone.utc)
    versions = [VersionRecord(0, None, now, "/b", None, 0, 0, status="retired"), VersionRecord(1, 0, now, "/c", None, 4, 4, status="serving")]
    traffic = {0: VersionTraffic(0, 200, 100, 60), 1: VersionTraffic(1, 100, 100, 40)}
    base, new = version_table(versions, traffic, serving=1)
    assert base.vs_parent is None and base.rating_rate == 0.5 and not base.serving
    assert base.status is VersionStatus.RETIRED  # a plain string names the member
    assert new.serving and new.parent == 0 and new.reward.value == 0.4
    assert new.vs_parent.difference == pytest.approx(-0.2)
    assert new.vs_parent.p_worse == pytest.approx(0.002339, abs=1e-5)


def test_version_without_traffic():
    now = datetime.now(timezone.utc)
    (row,) = version_table([VersionRecord(3, 2, now, "/x", None, 0, 0, status="published")], {}, serving=2)
    assert row.responses == 0 and row.rating_rate is None and row.reward.value is None and row.reward.n == 0
