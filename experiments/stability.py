"""`liveloop experiment stability`: one long SAO run on a fixed preference, to show it does not collapse:
the reward stays up, the kept fraction and the critic's grad norm stay bounded.

The config: configs/experiments/stability_experiment.toml (`--config` another preset or a path), the drift
experiment's file shape.

1. results directory <out>/stability-<date>-<hash>/; critic cold start as in the drift experiment;
2. a fresh server + learner; the simulated users (no switches) run while the learner's status
   (`/admin/learner`: step, kept fraction, critic grad norm, KL, staleness) is polled every second;
3. stability.png (reward moving average over events; kept fraction, critic grad norm and KL over learner
   steps), learner_trace.jsonl, events-sao.jsonl, summary.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from liveloop.clients.simulator import Simulator, write_events
from liveloop.experiments.analysis import moving_average
from liveloop.experiments.drift import (
    ExperimentConfig, _cleanup, _say, load_experiment, pretrain_scenario_critic, results_dir, toml_table, write_config,
)

TRACE_KEYS = (
    "learner/kept_fraction", "critic/grad_norm", "learner/kl", "learner/staleness_mean", "critic/explained_variance",
    "learner/grad_norm", "learner/step_kl", "learner/entropy", "learner/lr", "learner/kl_coef", "critic/value_error",
    "critic/explained_variance_window", "learner/advantage_positive_fraction", "learner/response_length",
    "learner/rejected_steps",
)
# the stability plot's learner panels: (trace key, title, log scale)
PANELS = (
    ("learner/kl", "KL to the base (the anchor's estimator, nats/token)", True),
    ("learner/step_kl", "KL moved by one update (nats/token)", True),
    ("learner/entropy", "policy entropy (nats/token)", False),
    ("learner/kept_fraction", "kept fraction (two-sided mask)", False),
    ("critic/value_error", "critic |V - r| over a window", False),
    ("learner/lr", "policy learning rate", True),
    ("learner/grad_norm", "policy grad norm (before clipping)", True),
)


def load_stability(config: str | Path = "stability_experiment") -> ExperimentConfig:
    """configs/experiments/stability_experiment.toml, another preset or a path: the drift experiment's shape (its
    first method runs)."""
    return load_experiment(config)


async def _poll(base_url: str, admin_key: str, trace: list[dict[str, Any]], stop: asyncio.Event, every: float = 1.0) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30) as http:
        last_step = -1
        start = time.monotonic()
        while not stop.is_set():
            try:
                s = (await http.get("/admin/learner")).json()
                if s.get("running") and s.get("step", -1) != last_step:
                    last_step = s["step"]
                    trace.append({"t": time.monotonic() - start, "step": s["step"], "version": s.get("version"),
                                  **learner_metrics(s)})
            except httpx.HTTPError:
                pass
            try:
                await asyncio.wait_for(stop.wait(), every)
            except asyncio.TimeoutError:
                pass


def learner_metrics(status: dict[str, Any]) -> dict[str, float | None]:
    """The traced metrics of one `/admin/learner` status: the learner's own, or with per-segment
    adapters the mean over the segments' lanes that report each (their `segments` statuses)."""
    lanes = [lane.get("metrics") or {} for lane in (status.get("segments") or {}).values()]
    if not lanes:
        m = status.get("metrics") or {}
        return {k: m.get(k) for k in TRACE_KEYS}
    out: dict[str, float | None] = {}
    for k in TRACE_KEYS:
        values = [float(m[k]) for m in lanes if m.get(k) is not None]
        out[k] = sum(values) / len(values) if values else None
    return out


async def _simulate_and_trace(sim: Simulator, base_url: str, admin_key: str) -> list[dict[str, Any]]:
    trace: list[dict[str, Any]] = []
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll(base_url, admin_key, trace, stop))
    try:
        await sim.run()
    finally:
        stop.set()
        await poller
    return trace


def run_stability(cfg: ExperimentConfig, out_root: Path, progress: bool = True, model_dir: Path | None = None) -> Path:
    from liveloop import devtools
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.position import critic_dir_for

    started = time.monotonic()
    method = cfg.methods[0]
    model_dir = Path(model_dir or cfg.model).resolve()
    # 1. results directory, critic cold start
    out = results_dir(out_root, cfg, kind="stability")
    write_config(out, cfg)
    workdir = out / "work" / method.name
    _say(progress, f"[stability] pre-training the critic on {cfg.pretrain_rollouts} rated rollouts")
    pretrain = pretrain_scenario_critic(cfg, model_dir, method.critic, critic_dir_for(LearnerConfig(checkpoint_dir=str(workdir / "versions")), 0), progress)
    # 2. server + learner, users, status trace
    server = devtools.start_server(
        workdir, model_dir, cfg.backend, timeout=cfg.server_timeout, learner=toml_table(method.learner),
        segments=toml_table(method.segments), extra="[critic]\n" + toml_table(method.critic),
    )
    try:
        sim = Simulator(cfg.scenario, server.base_url, devtools.USER_KEY, progress=sys.stderr if progress else None, admin_key=devtools.ADMIN_KEY)
        trace = asyncio.run(_simulate_and_trace(sim, server.base_url, devtools.ADMIN_KEY))
        status = httpx.get(server.base_url + "/admin/learner", headers={"Authorization": f"Bearer {devtools.ADMIN_KEY}"}, timeout=30).json()
    finally:
        server.stop()
    _cleanup(workdir)
    # 3. files
    write_events(sim.events, out / f"events-{method.name}.jsonl")
    with (out / "learner_trace.jsonl").open("w") as f:
        for row in trace:
            f.write(json.dumps(row) + "\n")
    numbers = stability_numbers(sim.events, trace, cfg.readapt_window)
    numbers |= {"pretrain": pretrain, "learner": {k: status.get(k) for k in ("step", "version", "idle_fraction", "skipped_steps")},
                "wall_seconds": time.monotonic() - started}
    plot_stability(out / "stability.png", sim.events, trace, cfg.readapt_window)
    (out / "results.json").write_text(json.dumps(numbers, indent=1, default=str))
    (out / "summary.md").write_text(_summary(cfg, numbers))
    return out


def _quarters(values: list[float]) -> list[float | None]:
    n = len(values)
    return [sum(values[i * n // 4 : (i + 1) * n // 4]) / max(1, (i + 1) * n // 4 - i * n // 4) if n >= 4 else None for i in range(4)]


def peak_and_hold(rewards: list[float], window: int) -> dict[str, float | None]:
    """Does the reward hold its plateau? Over the moving average (`window` events): its peak, the lowest
    it falls after the peak, and where it ends; `held` is whether it stays within 0.05 of the peak."""
    ma = moving_average(rewards, window)[window - 1 :] if len(rewards) >= window else []
    if not ma:
        return {"reward_peak": None, "reward_min_after_peak": None, "reward_final": None, "held": None, "hold_window": window}
    peak = max(range(len(ma)), key=ma.__getitem__)
    low = min(ma[peak:])
    return {"reward_peak": ma[peak], "reward_min_after_peak": low, "reward_final": ma[-1], "held": ma[peak] - low <= 0.05,
            "hold_window": window}


def stability_numbers(events: list[Any], trace: list[dict[str, Any]], window: int) -> dict[str, Any]:
    rated = [e for e in sorted(events, key=lambda e: e.t_reply) if e.rated]
    rewards = [float(e.reward) for e in rated]

    def series(key: str) -> list[float]:
        return [float(r[key]) for r in trace if r.get(key) is not None]

    kept, gn = series("learner/kept_fraction"), series("critic/grad_norm")
    held = peak_and_hold(rewards, max(window, len(rewards) // 10))
    return {
        **held,
        "kl_to_base_by_quarter": _quarters(series("learner/kl")),
        "step_kl_by_quarter": _quarters(series("learner/step_kl")),
        "entropy_by_quarter": _quarters(series("learner/entropy")),
        "value_error_by_quarter": _quarters(series("critic/value_error")),
        "response_length_by_quarter": _quarters(series("learner/response_length")),
        "feedback_events": len(rated),
        "reward_by_quarter": _quarters(rewards),
        "reward_last_window": sum(rewards[-window:]) / len(rewards[-window:]) if rewards else None,
        "kept_fraction_min": min(kept) if kept else None,
        "kept_fraction_mean": sum(kept) / len(kept) if kept else None,
        "critic_grad_norm_max": max(gn) if gn else None,
        "critic_grad_norm_by_quarter": _quarters(gn),
        "trace_points": len(trace),
    }


def plot_stability(path: Path, events: list[Any], trace: list[dict[str, Any]], window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [e for e in sorted(events, key=lambda e: e.t_reply) if e.rated]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    axes = axes.flatten()
    axes[0].plot(range(1, len(rated) + 1), moving_average([e.reward for e in rated], window))
    axes[0].set(title=f"reward, moving average ({window})", xlabel="feedback events", ylim=(-0.02, 1.02))
    steps = [r["step"] for r in trace]
    for ax, (key, title, log) in zip(axes[1:], PANELS):
        pts = [(s, r[key]) for s, r in zip(steps, trace) if r.get(key) is not None and (not log or r[key] > 0)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=3)
            if log:
                ax.set_yscale("log")
        ax.set(title=title, xlabel="learner step (sampled each second)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary(cfg: ExperimentConfig, n: dict[str, Any]) -> str:
    def f(x):
        return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))

    sc = cfg.scenario
    return "\n".join([
        f"# SAO stability on a fixed preference (config {cfg.digest})",
        "",
        "Segments: " + "; ".join(f"{s.name}: {s.styles[0]}" for s in sc.segments) + f". {n['feedback_events']} feedback events, "
        f"{n['wall_seconds'] / 60:.1f} min wall clock.",
        "",
        "| reward by quarter | reward (last window) | kept fraction min / mean | critic grad norm max | grad norm by quarter | learner steps | versions |",
        "|---|---|---|---|---|---|---|",
        f"| {', '.join(f(x) for x in n['reward_by_quarter'])} | {f(n['reward_last_window'])} | {f(n['kept_fraction_min'])} / "
        f"{f(n['kept_fraction_mean'])} | {f(n['critic_grad_norm_max'])} | {', '.join(f(x) for x in n['critic_grad_norm_by_quarter'])} | "
        f"{f(n['learner'].get('step'))} | {f(n['learner'].get('version'))} |",
        "",
        f"Plateau (moving average over {n['hold_window']} events): peak {f(n['reward_peak'])}, lowest after it "
        f"{f(n['reward_min_after_peak'])}, final {f(n['reward_final'])}; held within 0.05: {n['held']}.",
        "",
        "| by quarter | KL to base | KL per update | entropy | critic value error | reply length |",
        "|---|---|---|---|---|---|",
        f"| | {', '.join(f(x) for x in n['kl_to_base_by_quarter'])} | {', '.join(f(x) for x in n['step_kl_by_quarter'])} | "
        f"{', '.join(f(x) for x in n['entropy_by_quarter'])} | {', '.join(f(x) for x in n['value_error_by_quarter'])} | "
        f"{', '.join(f(x) for x in n['response_length_by_quarter'])} |",
        "",
        "Plot: stability.png. Trace: learner_trace.jsonl (the learner's status, sampled every second).",
        "",
    ])
