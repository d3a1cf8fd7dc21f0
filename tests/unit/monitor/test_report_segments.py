"""`liveloop report drift` with per-segment adapters: the version table gains a segment column (each
version's lineage) only when some version is an adapter; the drift table names its metadata key."""

from datetime import datetime, timezone

from liveloop.monitor.report import ReportData, render_html
from liveloop.monitor.versions import version_table
from liveloop.store.records import VersionRecord, VersionTraffic

NOW = datetime.now(timezone.utc)
DRIFT = {"detector": "page_hinkley", "delta": 0.005, "threshold": 5.0, "segment_key": "topic", "segments": {}}


def _page(tmp_path, versions: list[VersionRecord]) -> str:
    rows = version_table(versions, {1: VersionTraffic(1, 3, 2, 1)}, serving=0)
    data = ReportData(None, NOW, [], rows, [], [], DRIFT)
    return render_html(data, tmp_path / "report.html").read_text()


def test_the_segment_column_appears_with_adapters(tmp_path):
    base = VersionRecord(0, None, NOW, "/base", None, 0, 0, status="serving")
    plain = _page(tmp_path, [base])
    assert "<th>segment</th>" not in plain.split("<h2>Versions</h2>")[1].split("</table>")[0]
    assert "metadata <code>topic</code>" in plain
    cozy = VersionRecord(1, 0, NOW, "/a1", None, 1, 1, status="serving", segment="cozy")
    page = _page(tmp_path, [base, cozy]).split("<h2>Versions</h2>")[1].split("</table>")[0]
    assert "<th>segment</th>" in page
    assert "<td>v0</td><td>–</td><td>base</td><td>serving (serving)</td>" in page
    assert "<td>v1</td><td>v0</td><td>cozy</td><td>serving (serving)</td><td>3</td><td>2</td>" in page
