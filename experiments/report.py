"""The drift experiment's report: per-method numbers (analysis.py), PNG plots and a Markdown summary.

Files written into the results directory:
  reward_vs_events.png, reward_vs_time.png   one panel per user segment, one line per method
  summary.md                                 the table (events/seconds to re-adapt per switch, reward
                                             per phase, old-style share, versions, idle, GRPO wait)
  results.json                               the same numbers, machine-readable
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from liveloop.clients.scenario import switch_points
from liveloop.experiments.analysis import (
    group_waits, moving_average, preferred_share_by_phase, readapt_after_switches, segment_events,
)


def _phase_means(events: list[Any]) -> dict[str, float]:
    by: dict[str, list[int]] = {}
    for e in events:
        if e.rated:
            by.setdefault(f"{e.segment}/phase{e.phase}", []).append(e.reward)
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def method_numbers(cfg: Any, run: Any) -> dict[str, Any]:
    events = run.events
    w, thr = cfg.readapt_window, cfg.readapt_threshold
    readapts = readapt_after_switches(events, switch_points(cfg.scenario), w, thr)
    metrics = (run.learner or {}).get("metrics", {}) or {}
    published = [v for v in run.versions if v.get("version", 0) > 0]
    rated = [e for e in events if e.rated]
    waits = group_waits(events)
    return {
        "method": run.name,
        "error": run.error,
        "feedback_events": len(rated),
        "replies": len(events),
        "sim_seconds": run.sim_seconds,
        "server_start_seconds": run.start_seconds,
        "reward_mean": sum(e.reward for e in rated) / len(rated) if rated else None,
        "reward_mean_by_phase": _phase_means(events),
        "preferred_share_last_window": preferred_share_by_phase(events, w),
        "readapt": [asdict(r) for r in readapts],
        "versions_published": len(published),
        "learner_steps": run.learner.get("step"),
        "learner_idle_seconds": run.learner.get("idle_seconds"),
        "learner_busy_seconds": run.learner.get("busy_seconds"),
        "learner_idle_fraction": run.learner.get("idle_fraction"),
        "kept_fraction": metrics.get("learner/kept_fraction"),
        "clip_fraction": metrics.get("learner/clip_fraction"),
        "staleness_mean": metrics.get("learner/staleness_mean"),
        "critic_grad_norm": metrics.get("critic/grad_norm"),
        "group_wait_mean_seconds": metrics.get("learner/group_wait_mean_seconds"),
        "group_wait_max_seconds": metrics.get("learner/group_wait_max_seconds"),
        "client_group_wait_mean_seconds": sum(waits) / len(waits) if waits else None,
    }


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def summary_markdown(cfg: Any, numbers: list[dict[str, Any]], pretrain: dict[str, float], wall_seconds: float) -> str:
    sc = cfg.scenario
    switches = switch_points(sc)
    lines = [
        f"# Preference drift: {sc.name} (config {cfg.digest})",
        "",
        f"Same scenario and seeds for every method: {sc.max_events} feedback events, arrival {sc.arrival_rate}/s, "
        f"rating probability {sc.rating_probability}, feedback delay {sc.feedback_delay.distribution} "
        f"(median {sc.feedback_delay.median_seconds}s, cap {sc.feedback_delay.max_seconds}s); GRPO methods ask each prompt "
        f"G={cfg.group_size} times. Segments: "
        + "; ".join(f"{s.name} ({', '.join(s.topics)}): {' -> '.join(s.styles)} at {list(s.switch_at)} {s.switch_by}" for s in sc.segments)
        + ".",
        f"Re-adapted = the segment's reward moving average over {cfg.readapt_window} of its feedback events, all after the "
        f"switch, back at or above {cfg.readapt_threshold}; '-' = not within the run. Old/new share: the segment's last "
        f"{cfg.readapt_window} replies of the phase. Critic pre-training: {json.dumps({k: round(v, 3) for k, v in pretrain.items()})}.",
        f"Whole experiment: {wall_seconds / 60:.1f} min wall clock.",
        "",
    ]
    head = ["method", "events", "sim s"]
    for seg, phase, _at, old, new in switches:
        head += [f"{seg}: {old}->{new} events", "seconds", "old share", "new share"]
    head += ["reward per phase (mean)", "final reward per phase (last window)", "versions", "learner idle s (frac)",
             "GRPO group wait s (mean/max)", "kept/clip frac", "staleness"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in numbers:
        row = [n["method"] + (" (ERROR)" if n["error"] else ""), _fmt(n["feedback_events"]), _fmt(n["sim_seconds"], 0)]
        for r in n["readapt"]:
            row += [f"{_fmt(r['events'])}/{r['events_available']}", _fmt(r["seconds"], 0), _fmt(r["old_style_share"]), _fmt(r["new_style_share"])]
        row.append(", ".join(f"{k} {v:.2f}" for k, v in n["reward_mean_by_phase"].items()))
        finals = {}
        for r in n["readapt"]:
            finals[f"{r['segment']}/phase{r['phase']}"] = r["final_reward"]
        row.append(", ".join(f"{k} {_fmt(v)}" for k, v in finals.items()))
        row.append(_fmt(n["versions_published"]))
        row.append(f"{_fmt(n['learner_idle_seconds'], 0)} ({_fmt(n['learner_idle_fraction'])})")
        row.append(f"{_fmt(n['group_wait_mean_seconds'])}/{_fmt(n['group_wait_max_seconds'])}" if n["group_wait_mean_seconds"] is not None else "-")
        row.append(_fmt(n["kept_fraction"] if n["kept_fraction"] is not None else n["clip_fraction"]))
        row.append(_fmt(n["staleness_mean"]))
        lines.append("| " + " | ".join(row) + " |")
    errors = [f"- {n['method']}: {n['error']}" for n in numbers if n["error"]]
    if errors:
        lines += ["", "Errors:", *errors]
    lines += ["", "Plots: reward_vs_events.png, reward_vs_time.png. Raw events: events-<method>.jsonl.", ""]
    return "\n".join(lines)


def plot_curves(out: Path, cfg: Any, runs: list[Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = cfg.readapt_window
    paths = []
    segments = cfg.scenario.segments
    for kind in ("events", "time"):
        fig, axes = plt.subplots(1, len(segments), figsize=(6 * len(segments), 4), squeeze=False)
        for ax, seg in zip(axes[0], segments):
            for run in runs:
                evs = segment_events(run.events, seg.name)
                if not evs:
                    continue
                ma = moving_average([e.reward for e in evs], w)
                x = list(range(1, len(evs) + 1)) if kind == "events" else [e.t_reply for e in evs]
                ax.plot(x, ma, label=run.name, lw=1.2)
                if kind == "time":
                    for k in range(1, len(seg.styles)):
                        first = next((e for e in evs if e.phase >= k), None)
                        if first is not None:
                            ax.axvline(first.t_reply, ls=":", lw=0.6, color=ax.lines[-1].get_color())
            if kind == "events" and seg.switch_by == "feedback":
                for at in seg.switch_at:
                    ax.axvline(at, color="k", ls="--", lw=0.8)
            ax.axhline(cfg.readapt_threshold, color="grey", ls=":", lw=0.8)
            ax.set_title(f"{seg.name}: {' -> '.join(seg.styles)}")
            ax.set_xlabel(f"{seg.name}'s feedback events" if kind == "events" else "wall seconds since start")
            ax.set_ylabel(f"reward, moving average ({w})")
            ax.set_ylim(-0.02, 1.02)
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        path = out / f"reward_vs_{kind}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(out: Path, cfg: Any, runs: list[Any], pretrain: dict[str, float], wall_seconds: float) -> dict[str, Any]:
    numbers = [method_numbers(cfg, r) for r in runs]
    plot_curves(out, cfg, runs)
    (out / "summary.md").write_text(summary_markdown(cfg, numbers, pretrain, wall_seconds))
    result = {"config_digest": cfg.digest, "wall_seconds": wall_seconds, "pretrain": pretrain, "methods": numbers}
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result
