"""`liveloop report drift`: the dashboard's view as a file, read straight from the store.

    data = collect(store, config, since)        # replay ratings since `since` through the monitor
    render_png(data, "report.png")              # reward over time (versions, alarms), volume, per version
    render_html(data, "report.html")            # the same figure inline, plus the tables

Alarms here are recomputed by replaying the ratings since `since` through a fresh detector, so the
report shows what the configured detector says about that window (the server's own alarms are in
the operator event log and listed too). Ratings of keys quarantined now are left out of the series,
the alarms and the per-version rates, as in the server's monitor.

With per-segment adapters the version table gains a segment column (each version's lineage: a
segment's adapters, or the base weights') and the per-version bars name the segment.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from liveloop.monitor.config import MonitorConfig
from liveloop.monitor.drift import ALL, Bucket, DriftMonitor, RaisedAlarm
from liveloop.monitor.versions import VersionRow, lineage_of, version_table
from liveloop.store import Store
from liveloop.store.records import OperatorEventRecord
from liveloop.store.status import VersionStatus

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """`2h`, `30m`, `1d`, `45s` ago, or an ISO time (UTC if no zone); None for everything."""
    if not text:
        return None
    now = now or datetime.now(timezone.utc)
    m = _RELATIVE.match(text.strip())
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since: expected e.g. 2h, 30m, 1d or an ISO time, got {text!r}") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


@dataclass
class ReportData:
    since: datetime | None
    made: datetime
    series: list[Bucket]
    versions: list[VersionRow]
    alarms: list[RaisedAlarm]
    events: list[OperatorEventRecord]
    drift: dict[str, Any]  # the detector's state (`DriftMonitor.state`)


def collect(store: Store, config: MonitorConfig, since: datetime | None) -> ReportData:
    monitor = DriftMonitor(config, store.feedback, max_alarms=10_000)
    last = 0
    while True:  # the ratings since `since`, in arrival order
        events = store.feedback.rating_events(after_id=last, limit=5000, since=since, trusted=True)  # quarantined keys left out
        for e in events:
            monitor.observe(e)
        if len(events) < 5000:
            break
        last = events[-1].feedback_id
    serving = store.versions.latest_version()
    versions = version_table(store.versions.list_versions(), store.release.version_traffic(trusted=True), serving.version if serving else None, config.confidence)
    op_events = store.operator.events(since=since, limit=10_000)
    return ReportData(since, datetime.now(timezone.utc), monitor.series(), versions, list(monitor.alarms), op_events, monitor.state())


def _in_utc(t: datetime) -> datetime:
    """`t` in UTC (a naive time, as SQLite returns them, is the local time its timestamp says)."""
    return datetime.fromtimestamp(t.timestamp(), timezone.utc)


def _figure(data: ReportData):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_n, ax_v) = plt.subplots(3, 1, figsize=(11, 10), gridspec_kw={"height_ratios": [3, 1.4, 2]})
    times = [datetime.fromtimestamp(b.t, timezone.utc) for b in data.series]
    ax_r.plot(times, [b.reward.value for b in data.series], marker="o", ms=3, color="#1f5fd6", label="reward rate")
    ax_r.fill_between(times, [b.reward.low for b in data.series], [b.reward.high for b in data.series], color="#1f5fd6", alpha=0.15, label="95% interval")
    lo = min(times) if times else None
    for v in data.versions:
        t = datetime.fromtimestamp(v.created, timezone.utc)
        if v.version > 0 and (lo is None or t >= lo):
            ax_r.axvline(t, color="#5566aa", ls="--", lw=1)
            ax_r.text(t, 1.02, f"v{v.version}", color="#5566aa", fontsize=8, ha="center", transform=ax_r.get_xaxis_transform())
    for a in data.alarms:
        t = _in_utc(a.at)
        ax_r.axvline(t, color="#d33", lw=1.5)
        label = "all" if a.segment == ALL else a.segment
        ax_r.text(t, 0.02, f" {label} {a.alarm.direction}", color="#d33", fontsize=8, rotation=90, va="bottom", transform=ax_r.get_xaxis_transform())
    ax_r.set_ylim(0, 1)
    ax_r.set_ylabel("thumbs-up rate")
    ax_r.set_title("Reward rate per time bucket (dashed: versions, red: drift alarms)")
    ax_r.legend(loc="lower left", fontsize=8)
    ax_n.bar(times, [b.reward.n for b in data.series], width=(times[1] - times[0]) * 0.8 if len(times) > 1 else 0.0005, color="#777")
    ax_n.set_ylabel("ratings")
    ax_n.sharex(ax_r)
    for ax in (ax_r, ax_n):
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    rated = [v for v in data.versions if v.reward.n]
    xs = [f"v{v.version}" if v.segment is None else f"v{v.version}\n{v.segment}" for v in rated]
    rates = [v.reward.value for v in rated]
    err = [[r - v.reward.low for r, v in zip(rates, rated)], [v.reward.high - r for r, v in zip(rates, rated)]]
    colors = ["#2a7" if v.serving else ("#bbb" if v.status == VersionStatus.ROLLED_BACK else "#1f5fd6") for v in rated]
    ax_v.bar(xs, rates, yerr=err, color=colors, capsize=3)
    ax_v.set_ylim(0, 1)
    ax_v.set_ylabel("reward rate")
    ax_v.set_title("Per version (green: serving, grey: rolled back; bars: 95% interval)")
    fig.tight_layout()
    return fig


def render_png(data: ReportData, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = _figure(data)
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
    return Path(path)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _utc(t: datetime) -> str:
    return _in_utc(t).isoformat(timespec="seconds")


def render_html(data: ReportData, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig = _figure(data)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    img = base64.b64encode(buf.getvalue()).decode()
    adapters = any(v.segment is not None for v in data.versions)  # the segment column only where there are adapters
    versions = _table(
        ["version", "parent", *(["segment"] if adapters else []), "status", "responses", "ratings", "reward [95% CI]", "vs parent (p)"],
        [
            [
                f"v{v.version}", "–" if v.parent is None else f"v{v.parent}", *([lineage_of(v)] if adapters else []),
                v.status + (" (serving)" if v.serving else ""),
                v.responses, v.reward.n, f"{_pct(v.reward.value)} [{_pct(v.reward.low)}, {_pct(v.reward.high)}]",
                f"{100 * v.vs_parent.difference:+.1f} pts ({v.vs_parent.p_two_sided:.3f})" if v.vs_parent else "–",
            ]
            for v in data.versions
        ],
    )
    alarms = _table(
        ["time (UTC)", "segment", "direction", "before", "after", "version"],
        [[_utc(a.at), a.segment, a.alarm.direction, _pct(a.alarm.before), _pct(a.alarm.after), a.policy_version] for a in data.alarms],
    )
    segments = _table(["segment", "ratings", "reward [95% CI]"], [[k, s["n"], f"{_pct(s['rate'])} [{_pct(s['low'])}, {_pct(s['high'])}]"] for k, s in data.drift["segments"].items()])
    events = _table(["time (UTC)", "event", "version", "detail"], [[_utc(e.created_at), e.kind, e.version, e.detail] for e in data.events])
    since = data.since.isoformat(timespec="seconds") if data.since else "the beginning"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>liveloop drift report</title>
<style>body{{font:14px system-ui,sans-serif;margin:20px;color:#1d2330}}table{{border-collapse:collapse;margin-bottom:18px}}
th,td{{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}}</style></head><body>
<h1>liveloop drift report</h1><p>Ratings since {html.escape(since)}; made {data.made.isoformat(timespec="seconds")};
detector {html.escape(data.drift["detector"])} (delta {data.drift["delta"]}, threshold {data.drift["threshold"]}).</p>
<img alt="reward over time" src="data:image/png;base64,{img}">
<h2>Versions</h2>{versions}<h2>Drift alarms (recomputed over this window)</h2>{alarms}
<h2>Drift per user segment (metadata <code>{html.escape(str(data.drift.get("segment_key", "")))}</code>)</h2>{segments}<h2>Operator events</h2>{events}</body></html>"""
    Path(path).write_text(page)
    return Path(path)
