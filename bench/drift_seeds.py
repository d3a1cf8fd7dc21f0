"""The drift experiment over seeds on the learning rig, with intervals: re-adaptation and reward by phase
per method.

For each seed and each method of the drift config (default `drift_long`: five methods), one run of
experiments/drift_rig.py: the scenario's users and judge, the method's learner settings, the real store
and learner in one process, every reply rated, `lag` replies sampled at a time; the critic pre-trained
once per seed and shared by the methods with a critic. The served version is
`liveloop experiment drift --config drift_long --seed N` (docs/design.md, "The drift experiment at length").

    .venv/bin/python bench/drift_seeds.py [--config drift_long] [--methods ...] [--seeds 0 1 2 3 4]
        [--lag 4] [--jobs 2] [--start-by MINUTES] [--out drift_seeds] [--doc docs/results/drift_rig.md]

Prints one JSON row per run as it ends, then the tables: per method, the ratings after each segment's
switch until its 30-rating moving average is back at 0.5 (median [order-statistic interval] over seeds,
experiments/intervals.py; a run that never got there counts as past the cap) with how many seeds
re-adapted, and the reward by phase (last 30 ratings of each phase and every rating of it: mean [95%
t-interval]). `--start-by M`: no seed starts after M minutes (the tables cover the seeds every method
finished). Saves bench/results/<out>.json and writes the tables into `--doc`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path

from common import ROOT, default_model, save  # noqa: E402

# the longest first, so two workers finish a seed together
ORDER = ("sao_adapters", "sao", "sliding_window", "grpo", "grpo_dis")


def _pretrain(config: str, model_dir: str, seed: int, out_dir: str) -> dict:
    import torch

    from liveloop.experiments.drift import load_experiment
    from liveloop.experiments.drift_rig import pretrain_critic

    torch.set_num_threads(1)
    return pretrain_critic(load_experiment(config), Path(model_dir), seed, Path(out_dir))


def _run(config: str, model_dir: str, method: str, seed: int, lag: int, workdir: str, critic_dir: str | None,
         critic: dict | None) -> dict:
    import shutil

    from liveloop.experiments.drift import load_experiment
    from liveloop.experiments.drift_rig import drift_run

    cfg = load_experiment(config, only=[method])
    try:
        run = drift_run(Path(workdir), Path(model_dir), cfg, cfg.methods[0], seed, lag=lag,
                        critic_dir=Path(critic_dir) if critic_dir else None, critic=critic)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return run.row()


def plan(methods: list[str], seeds: list[int], uses_critic: dict[str, bool]) -> list[tuple]:
    """The tasks in order: per seed, the critic's pre-training (when a method needs it), then the methods
    longest first."""
    ordered = sorted(methods, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))
    tasks: list[tuple] = []
    for s in seeds:
        if any(uses_critic[m] for m in methods):
            tasks.append(("pretrain", s))
        tasks += [("run", s, m) for m in ordered]
    return tasks


def readapt_cells(rows: list[dict], switch: str) -> tuple[list[int | None], int]:
    """The ratings to re-adapt after `switch` over the rows (None: never), and how many re-adapted."""
    values = [r["readapt"].get(switch) for r in rows]
    return values, sum(v is not None for v in values)


def summarize(rows: list[dict], methods: list[str]) -> tuple[list[dict], list[int]]:
    """Per method, over the seeds every method finished: re-adaptation per switch (median_ci, seeds that
    re-adapted, the fewest ratings any run had after the switch) and the reward by phase (mean_ci)."""
    from liveloop.experiments.intervals import mean_ci, median_ci

    seeds = sorted({r["seed"] for r in rows})
    complete = [s for s in seeds if all(any(r["seed"] == s and r["method"] == m for r in rows) for m in methods)]
    out = []
    for m in methods:
        runs = [r for r in rows if r["method"] == m and r["seed"] in complete]
        if not runs:
            continue
        entry: dict = {"method": m, "seeds": [r["seed"] for r in runs], "readapt": {}, "reward_by_phase": {}, "phase_means": {}}
        for switch in runs[0]["readapt"]:
            values, reached = readapt_cells(runs, switch)
            ci = median_ci(values)
            entry["readapt"][switch] = {"median": ci.median, "interval": str(ci), "reached": reached, "values": values,
                                        "cap": min(r["after_switch"][switch] for r in runs)}
        for key in ("reward_by_phase", "phase_means"):
            for phase in runs[0][key]:
                ci = mean_ci([r[key][phase] for r in runs])
                entry[key][phase] = {"mean": ci.mean, "low": ci.low, "high": ci.high, "interval": str(ci)}
        entry["seconds"] = mean_ci([r["seconds"] for r in runs]).mean
        out.append(entry)
    return out, complete


def tables(summary: list[dict]) -> str:
    if not summary:
        return "(no seed finished every method)"
    switches = list(summary[0]["readapt"])
    phases = list(summary[0]["reward_by_phase"])
    head = " | ".join(f"{s}: median [interval]" + " | seeds re-adapted" for s in switches)
    lines = [f"| method | {head} | seconds per run |", "|---|" + "---|---|" * len(switches) + "---|"]
    for e in summary:
        cells = " | ".join(f"{e['readapt'][s]['interval']} | {e['readapt'][s]['reached']}/{len(e['seeds'])}" for s in switches)
        lines.append(f"| {e['method']} | {cells} | {e['seconds']:.0f} |")
    caps = {s: min(e["readapt"][s]["cap"] for e in summary) for s in switches}
    lines += ["", "(re-adaptation: ratings of the segment after its switch until its 30-rating moving average is back at "
              "0.5 or above; `>cap`: not within the run, at least " + ", ".join(f"{s} {c}" for s, c in caps.items()) + " ratings.)", ""]
    for key, what in (("reward_by_phase", "last 30 ratings of each phase"), ("phase_means", "every rating of each phase")):
        lines += [f"Reward by phase ({what}): mean [95% t-interval] over seeds", "",
                  "| method | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
        for e in summary:
            lines.append(f"| {e['method']} | " + " | ".join(e[key][p]["interval"] for p in phases) + " |")
        lines.append("")
    return "\n".join(lines)


def write_doc(path: Path, command: str, started: datetime, wall: float, complete: list[int], rows: list[dict],
              summary: list[dict], saved: Path) -> None:
    ran = sorted({(r["seed"], r["method"]) for r in rows})
    text = f"""# The drift experiment on the learning rig, over seeds

Command (from the repository root, {started:%Y-%m-%d %H:%M} UTC, wall time {wall / 60:.0f} minutes):

    {command}

Seeds every method finished (the tables): {complete}; runs that ended in all: {len(ran)}. Raw rows and
environment: `{saved.relative_to(ROOT)}`. What it is and how it differs from the served run:
docs/design.md, "The drift experiment on five seeds".

{tables(summary)}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def redo_tables(saved: list[Path], doc: str) -> None:
    """The tables of saved results (a run stopped before its end saves the runs that ended). Several: their
    rows merged, a later file's run of a (method, seed) replacing an earlier one's (a method rerun on a
    newer config); the doc gives every file's command."""
    from liveloop.experiments.drift import load_experiment

    results = [json.loads(p.read_text()) for p in saved]
    rows: dict[tuple, dict] = {}
    methods: list[str] = []
    for result in results:
        rows |= {(r["method"], r["seed"]): r for r in result["rows"]}
        config = result["config"]
        methods += [m.name for m in load_experiment(config["config"], only=config["methods"]).methods if m.name not in methods]
    methods.sort(key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))
    merged = list(rows.values())
    summary, complete = summarize(merged, methods)
    print(tables(summary))
    if doc:
        wall = sum(r["wall_seconds"] for r in results)
        started = datetime.fromtimestamp(saved[0].stat().st_mtime - results[0]["wall_seconds"], timezone.utc)
        command = "\n    ".join(r["config"]["command"] for r in results)
        write_doc(ROOT / doc, command, started, wall, complete, merged, summary, saved[-1].resolve())
        print(f"wrote {doc}")


def main() -> None:
    from liveloop.experiments.drift import load_experiment

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="drift_long")
    parser.add_argument("--methods", nargs="+", default=None, help="default: the config's methods")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--lag", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (this machine: 2 cores)")
    parser.add_argument("--start-by", type=float, default=None, help="minutes: no seed starts after this")
    parser.add_argument("--out", default="drift_seeds", help="result name under bench/results/")
    parser.add_argument("--doc", default="docs/results/drift_rig.md", help="where the tables go ('' = nowhere)")
    parser.add_argument("--tables-from", nargs="+", type=Path, default=None,
                        help="saved results: print their tables (and write --doc), run nothing; a later file's run of a "
                        "(method, seed) replaces an earlier one's")
    args = parser.parse_args()
    if args.tables_from:
        redo_tables(args.tables_from, args.doc)
        return
    command = ".venv/bin/python bench/drift_seeds.py " + shlex.join(sys.argv[1:])
    cfg = load_experiment(args.config, only=args.methods)
    methods = [m.name for m in cfg.methods]
    uses_critic = {m.name: m.uses_critic for m in cfg.methods}
    model_dir = str(default_model())
    started_at, started = datetime.now(timezone.utc), time.monotonic()
    todo = plan(methods, args.seeds, uses_critic)
    critics: dict[int, dict] = {}
    rows: list[dict] = []
    running: dict[Future, tuple] = {}
    begun: set[int] = set()
    errors: list[str] = []

    def result(rows: list[dict], errors: list[str], todo: list[tuple], wall: float) -> Path:
        summary, complete = summarize(rows, methods)
        return save(args.out, {"config": vars(args) | {"command": command}, "wall_seconds": wall, "complete_seeds": complete,
                               "not_started": [list(t) for t in todo], "errors": errors, "summary": summary, "rows": rows})

    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.jobs) as pool:
        def ready(task: tuple) -> bool:
            if task[0] == "run" and uses_critic[task[2]] and task[1] not in critics:
                return False
            late = args.start_by is not None and time.monotonic() - started > 60 * args.start_by
            return task[1] in begun or not late

        while todo or running:
            while len(running) < args.jobs:
                task = next((t for t in todo if ready(t)), None)
                if task is None:
                    break
                todo.remove(task)
                begun.add(task[1])
                critic_dir = f"{tmp}/critic-{task[1]}"
                if task[0] == "pretrain":
                    fut = pool.submit(_pretrain, args.config, model_dir, task[1], critic_dir)
                else:
                    c = uses_critic[task[2]]
                    fut = pool.submit(_run, args.config, model_dir, task[2], task[1], args.lag, f"{tmp}/{task[1]}-{task[2]}",
                                      critic_dir if c else None, critics.get(task[1]) if c else None)
                running[fut] = task
            if not running:  # what is left may not start (past --start-by)
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                task = running.pop(fut)
                try:
                    value = fut.result()
                except Exception as exc:  # reported; the seed counts as incomplete, the other runs go on
                    errors.append(f"{task}: {type(exc).__name__}: {exc}"[:500])
                    print(json.dumps({"task": list(task), "error": errors[-1]}), flush=True)
                    continue
                if task[0] == "pretrain":
                    critics[task[1]] = value
                    print(json.dumps({"seed": task[1], "critic": value}), flush=True)
                else:
                    rows.append(value)
                    print(json.dumps(value), flush=True)
                    result(rows, errors, todo, time.monotonic() - started)  # saved as runs end
    wall = time.monotonic() - started
    summary, complete = summarize(rows, methods)
    print(tables(summary))
    saved = result(rows, errors, todo, wall)
    print(f"saved {saved}")
    if args.doc:
        write_doc(ROOT / args.doc, command, started_at, wall, complete, rows, summary, saved)
        print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
