"""The stability scenario on five seeds: does one policy learn both segments' preferences, or seesaw?

The fixed-preference scenario of `liveloop experiment stability` (configs/experiments/stability_experiment.toml:
cozy's users want chuunibyou, night's classical, neither changes) run on the learning rig
(experiments/drift_rig.py: the real store and learner in one process, every reply rated, the learner up
to 4 ratings behind), 2,200 ratings per seed by default. Per seed: the mean reward per quarter of the
run, overall and per segment; the verdict the issue asks for: both segments at >= 0.8 in the last quarter.

    .venv/bin/python bench/stability_seeds.py [--config stability_experiment|stability_adapters]
        [--seeds 0 1 2 3 4] [--events 2200] [--learner "max_batch_size = 4" ...] [--jobs 2] [--out NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import default_model, save  # noqa: E402

QUARTERS = 4
GOAL = 0.8


def quarters(ratings: list, segment: str | None = None) -> list[float | None]:
    """Mean reward in each quarter of the run (by overall rating index), of one segment's ratings or all."""
    n = len(ratings)
    out = []
    for q in range(QUARTERS):
        part = [r.reward for r in ratings[q * n // QUARTERS:(q + 1) * n // QUARTERS] if segment is None or r.segment == segment]
        out.append(sum(part) / len(part) if part else None)
    return out


def _seed(model_dir: str, config: str, seed: int, events: int, learner: tuple[str, ...]) -> dict:
    from liveloop.config import read_toml
    from liveloop.experiments.drift import load_experiment
    from liveloop.experiments.drift_rig import drift_run

    cfg = load_experiment(config)
    cfg = dataclasses.replace(cfg, scenario=dataclasses.replace(cfg.scenario, max_events=events))
    method = cfg.methods[0]
    if learner:
        method = dataclasses.replace(method, learner={**method.learner, **read_toml(text="\n".join(learner))})
    with tempfile.TemporaryDirectory() as tmp:
        run = drift_run(Path(tmp), Path(model_dir), cfg, method, seed)
    segments = [s.name for s in cfg.scenario.segments]
    row = {"config": config, "seed": seed, "learner": list(learner), "ratings": len(run.ratings), "seconds": round(run.seconds, 1),
           "overall": quarters(run.ratings), **{s: quarters(run.ratings, s) for s in segments}}
    row["both_at_goal"] = all((row[s][-1] or 0.0) >= GOAL for s in segments)
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict], segments: list[str]) -> str:
    def show(values: list[float | None]) -> str:
        return ", ".join("-" if v is None else f"{v:.2f}" for v in values)

    lines = ["| seed | overall by quarter | " + " | ".join(f"{s} by quarter" for s in segments) + " | both >= 0.8 in the last quarter |",
             "|---|---|" + "---|" * len(segments) + "---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {show(r['overall'])} | " + " | ".join(show(r[s]) for s in segments) +
                     f" | {'yes' if r['both_at_goal'] else 'no'} |")
    lines.append(f"\nboth segments at >= {GOAL} in the last quarter: {sum(r['both_at_goal'] for r in rows)} of {len(rows)} seeds")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="stability_experiment")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--events", type=int, default=2200)
    parser.add_argument("--learner", nargs="*", default=[], help="extra [learner] lines for the method")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default="stability_seeds")
    args = parser.parse_args()
    model_dir = str(default_model())
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_seed, *zip(*[(model_dir, args.config, s, args.events, tuple(args.learner)) for s in args.seeds])))
    from liveloop.experiments.drift import load_experiment

    print(table(rows, [s.name for s in load_experiment(args.config).scenario.segments]))
    print(f"saved {save(args.out, {'config': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
