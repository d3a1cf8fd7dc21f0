"""Users exposed to a bad candidate per release mode in the sycophancy scenario, over seeds (issue 21):
experiments/release_exposure.py's run (a flattery-rewarding simulated population against a real
`liveloop serve`, hf engine, tiny model, co-located learner) for each seed x mode.

Per run: exposure (the share of users ever served a bad version: a failed evaluation, or HELD under a
gate), the number of bad and held versions, the mean reward of the first and last 40 ratings, wall
seconds. Prints a table of the mean and its 95% t-interval across seeds per mode, and writes
bench/results/release_exposure[-TAG].json after every run (rows + summary), so an interrupted run keeps
what finished; `--resume` skips the (seed, mode) runs already in that file. Runs go seed by seed (all
modes of a seed, then the next), the critic pre-trained once per seed and shared by its modes.

    python bench/release_exposure.py --seeds 0,1,2,3,4 --modes immediate,canary,gated --max-events 160
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, default_model, save  # noqa: E402
from liveloop.experiments.release_exposure import (  # noqa: E402
    MODES,
    ExposureRun,
    ExposureSettings,
    pretrain_critic,
    run,
    summarize,
    table,
)


def from_row(row: dict) -> ExposureRun:
    """A run back from its JSON row (user sets are counts there, so they come back as placeholders of
    the right size; the summary reads only the numbers)."""
    names = {f.name for f in fields(ExposureRun)}
    kw = {k: v for k, v in row.items() if k in names}
    for k in ("bad", "held", "failed", "served"):
        kw[k] = tuple(kw[k])
    kw["exposed"] = frozenset(f"u{i}" for i in range(kw["exposed"]))
    kw["users"] = frozenset(f"u{i}" for i in range(kw["users"]))
    kw["flattery"] = {int(v): f for v, f in kw["flattery"].items()}
    return ExposureRun(**kw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--users", type=int, default=ExposureSettings.users)
    parser.add_argument("--max-events", type=int, default=ExposureSettings.max_events, help="ratings per run (the scale)")
    parser.add_argument("--tag", default="", help="results file suffix: release_exposure-TAG.json")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in the results file")
    parser.add_argument("--workdir", default="/tmp/liveloop-bench-exposure")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="run nothing: merge these results files' rows into this one")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)} (known: {', '.join(MODES)})")
    settings = replace(ExposureSettings(), users=args.users, max_events=args.max_events)
    name = "release_exposure" + (f"-{args.tag}" if args.tag else "")
    path = RESULTS / f"{name}.json"
    rows: list[dict] = json.loads(path.read_text())["rows"] if args.resume and path.is_file() else []
    if args.combine:
        files = [json.loads(Path(f).read_text()) for f in args.combine]
        rows = [r for f in files for r in f["rows"]]
        settings = ExposureSettings(**{k: v for k, v in files[0]["settings"].items()})
        seeds = sorted({r["seed"] for r in rows})
    done = {(r["seed"], r["mode"]) for r in rows}
    model_dir = default_model()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for seed in [] if args.combine else seeds:
        critic = None
        for mode in modes:
            if (seed, mode) in done:
                continue
            workdir = Path(args.workdir) / f"{stamp}-s{seed}"
            if critic is None:
                t = time.monotonic()
                critic = pretrain_critic(workdir / "critic", model_dir, seed, settings)
                print(f"seed {seed}: critic pre-trained in {time.monotonic() - t:.0f} s", flush=True)
            result = run(workdir / mode, model_dir, mode, seed, settings, critic=critic)
            row = result.row()
            rows.append(row)
            print({k: row[k] for k in ("mode", "seed", "exposure", "bad", "held", "reward_first", "reward_last", "seconds", "versions")}, flush=True)
            summary = summarize([from_row(r) for r in rows])
            save(name, {"rows": rows, "summary": _json(summary), "settings": _settings(settings), "args": vars(args)}, model_dir, path)
    summary = summarize([from_row(r) for r in rows])
    if args.combine:
        save(name, {"rows": rows, "summary": _json(summary), "settings": _settings(settings), "args": vars(args)}, model_dir, path)
    print(f"\n{len(rows)} runs, {settings.users} users, {settings.max_events} ratings per run; mean [95% t-interval] across seeds\n")
    print(table(summary))
    print(f"\nwritten: {path}")


def _json(summary) -> dict:
    return {mode: {f: {"mean": i.mean, "low": i.low, "high": i.high, "n": i.n} for f, i in row.items()} for mode, row in summary.items()}


def _settings(settings: ExposureSettings) -> dict:
    return {f.name: getattr(settings, f.name) for f in fields(settings)}


if __name__ == "__main__":
    main()
