"""Ratings-to-effect for new objectives, whole policy vs a segment's adapter, over seeds, with intervals.

For each objective (rule rewards, liveloop/rewards.py), each seed and each way of learning (`shared`:
the whole policy; `adapter`: the cozy segment's LoRA adapter), one run of the learning rig
(experiments/uptake.py: the real store and learner in one process, users rating every reply, the
learner up to 4 ratings behind; a critic pre-trained on the objective, shared by both modes of a seed; the
whole policy is the shipped learner, the adapter that plus configs/fragments/adapter_learning.toml, as shipped):
ratings until the reward's 40-rating moving average reaches the base rate + 0.25, the probe rate
before/after on 48 fixed prompts, and the other segment's change (the leak; it must be 0 for an adapter).
The served version of this benchmark, through the real server and engine, is bench/new_objectives_served.py.

    .venv/bin/python bench/new_objectives.py [--objectives ...] [--modes shared adapter] [--seeds 0 1 2 3 4]
        [--max-ratings 300] [--learner "target_step_kl = 0.01"] [--lora "rank = 16"] [--critic ...]
        [--out name] [--jobs 2]

Prints one JSON row per run as it ends, then the table: per objective and mode, the median ratings to
effect with its order-statistic interval over seeds (experiments/intervals.py; a run that never got
there counts as past the cap), how many seeds got there, the probe rate before/after (mean, 95% t) and
the largest leak to the other segment. Saves everything under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import default_model, logged_rows, save  # noqa: E402

from liveloop.clients.rewards import SIX_OBJECTIVES

ADAPTER_PRESET = ("adapter_learning",)  # how the shipped adapter presets learn (configs/fragments/adapter_learning.toml)
RUN_FIELDS = ("objective", "mode", "seed", "before", "after", "other_before", "other_after", "leak", "ratings_to_effect",
              "ratings", "critic_ev", "seconds")


def _seed_runs(model_dir: str, cache: str, objective: str, seed: int, modes: list[str], knobs: dict) -> list[dict]:
    """Both modes of one (objective, seed), sharing one pre-trained critic (one worker process)."""
    from liveloop.experiments.uptake import SHIPPED, UptakeSpec, cached_critic, uptake

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        specs = [UptakeSpec(objective, mode, seed=seed, extends=SHIPPED + ADAPTER_PRESET * (mode == "adapter"), **knobs)
                 for mode in modes]
        critic_dir, ev = cached_critic(Path(cache), Path(model_dir), specs[0])
        for spec in specs:
            run = uptake(Path(tmp) / spec.mode, Path(model_dir), spec, critic_from=critic_dir, critic_ev=ev)
            row = run.row() | {"rewards": run.rewards}
            print(json.dumps({k: row[k] for k in RUN_FIELDS}), flush=True)
            rows.append(row)
    return rows


def _logged(paths: list[str]) -> list[dict]:
    return logged_rows(paths, ("objective", "mode", "seed"))


def summarize(rows: list[dict]) -> list[dict]:
    """Per (objective, mode): the median ratings to effect with its interval, seeds that got there, probe
    rates before/after with t-intervals, and the largest absolute leak."""
    from liveloop.experiments.intervals import mean_ci, median_ci

    out = []
    for key in dict.fromkeys((r["objective"], r["mode"]) for r in rows):
        runs = [r for r in rows if (r["objective"], r["mode"]) == key]
        out.append({
            "objective": key[0], "mode": key[1], "seeds": len(runs),
            "reached": sum(r["ratings_to_effect"] is not None for r in runs),
            "ratings_to_effect": str(median_ci([r["ratings_to_effect"] for r in runs])),
            "median": median_ci([r["ratings_to_effect"] for r in runs]).median,
            "before": str(mean_ci([r["before"] for r in runs])), "after": str(mean_ci([r["after"] for r in runs])),
            "max_leak": max(abs(r["leak"]) for r in runs),
        })
    return out


def table(summary: list[dict]) -> str:
    lines = ["| objective | learning | ratings to effect: median [interval] | seeds there | probe before | probe after | largest leak to the other segment |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| `{s['objective']}` | {s['mode']} | {s['ratings_to_effect']} | {s['reached']}/{s['seeds']} | "
                     f"{s['before']} | {s['after']} | {s['max_leak']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="+", default=list(SIX_OBJECTIVES))
    parser.add_argument("--modes", nargs="+", default=["shared", "adapter"], choices=["shared", "adapter"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--max-ratings", type=int, default=300)
    parser.add_argument("--learner", nargs="*", default=[], help="extra [learner] lines, e.g. 'target_step_kl = 0.01'")
    parser.add_argument("--lora", nargs="*", default=[], help="extra [learner.lora] lines, e.g. 'rank = 16'")
    parser.add_argument("--critic", nargs="*", default=[], help="extra [critic] lines")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (this machine: 2 cores)")
    parser.add_argument("--out", default="new_objectives", help="result name under bench/results/")
    parser.add_argument("--critic-cache", default=str(Path(tempfile.gettempdir()) / "liveloop-critics"),
                        help="pre-trained critics, one per objective and seed (bench/levers.py fills the same cache)")
    parser.add_argument("--summarize", nargs="*", metavar="LOG", help="only table the JSON rows these runs' logs printed")
    parser.add_argument("--done", nargs="*", default=[], metavar="LOG", help="skip (objective, seed, mode) runs these logs printed")
    args = parser.parse_args()
    if args.summarize:
        rows = _logged(args.summarize)
        print(table(summarize(sorted(rows, key=lambda r: (args.objectives.index(r["objective"])
                                                          if r["objective"] in args.objectives else 99, r["mode"] != "shared")))))
        return
    model_dir = str(default_model())
    knobs = {"max_ratings": args.max_ratings, "learner": tuple(args.learner), "lora": tuple(args.lora), "critic": tuple(args.critic)}
    done = {(r["objective"], r["seed"], r["mode"]) for r in _logged(args.done)}
    jobs = [(model_dir, args.critic_cache, o, s, [m for m in args.modes if (o, s, m) not in done], knobs)
            for o in args.objectives for s in args.seeds]
    jobs = [job for job in jobs if job[4]]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [row for rows in pool.map(_seed_runs, *zip(*jobs)) for row in rows]
    summary = summarize(rows)
    print(table(summary))
    print(f"saved {save(args.out, {'config': vars(args), 'summary': summary, 'rows': rows})}")


if __name__ == "__main__":
    main()
