"""The lever sweep: what limits how fast the learner takes up a new objective, each lever's effect with a
95% interval over seeds.

A lever is a set of TOML lines over the shipped learner (`[learner]`, `[learner.lora]`, `[critic]`). Every
lever runs on the learning rig (experiments/uptake.py) for each objective, mode and seed with a fixed
budget of ratings (default 80, the issue's target; the run does not stop at the effect), paired with the baseline on the
same seed (same prompts, same sampling seed, same pre-trained critic). Measures per run:
  - `mean_reward`: the mean reward over the budget (the area under the learning curve: what the users
    who rated saw);
  - `lift`: the probe's rate after the budget minus before (48 fixed prompts, paired);
  - `ratings_to_effect` when the 40-rating moving average reached base + 0.25 within the budget.
Per lever, objective and mode: the mean of each measure and the paired difference to the baseline with
its 95% t-interval over seeds (experiments/intervals.py). An effect whose interval excludes 0 is a lever.

    .venv/bin/python bench/levers.py [--levers baseline step_target lr_ceiling ...] [--objectives ...]
        [--modes shared adapter] [--seeds 0 1 2 3 4] [--budget 120] [--jobs 2] [--out levers]

`--list` prints the levers; `--summarize LOG...` tables the rows a sweep printed (an interrupted one too). Pre-trained critics are cached under --critic-cache (one per objective and
seed), so a later sweep or bench/new_objectives.py reuses them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import default_model, logged_rows, save  # noqa: E402

# name -> (modes it applies to, {"learner": [...], "lora": [...], "critic": [...]})
LEVERS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "baseline": (("shared", "adapter"), {}),
    # the step-size controller's target and bounds (the adapter's rate sits at the 2e-3 ceiling)
    "lr_ceiling": (("shared", "adapter"), {"learner": ("max_learning_rate = 2e-2",)}),
    "step_target": (("shared", "adapter"), {"learner": ("target_step_kl = 0.02", "max_step_kl = 0.2")}),
    "step_both": (("shared", "adapter"), {"learner": ("target_step_kl = 0.02", "max_step_kl = 0.2", "max_learning_rate = 2e-2")}),
    # the KL anchor's target (nats per token from the base)
    "kl_loose": (("shared", "adapter"), {"learner": ("target_kl_to_base = 2.0",)}),
    "kl_off": (("shared", "adapter"), {"learner": ("kl_coef = 0.0",)}),
    # advantages: near-Monte-Carlo lambda (shipped since the second sweep) or the spec's length-adaptive 0.05
    "lambda_mc": (("shared", "adapter"), {"learner": ("lambda_alpha = 1.0",)}),
    "lambda_spec": (("shared", "adapter"), {"learner": ("lambda_alpha = 0.05",)}),
    # the adapter's shape
    "rank32": (("adapter",), {"lora": ("rank = 32", "alpha = 64.0")}),
    "alpha64": (("adapter",), {"lora": ("alpha = 64.0",)}),
    "lm_head": (("adapter",), {"lora": ('target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]',)}),
    "lm_head_lr": (("adapter",), {"lora": ('target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]',
                                            "max_learning_rate = 2e-2")}),
    "lm_head_lr5": (("adapter",), {"lora": ('target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]',
                                             "max_learning_rate = 5e-3")}),
    "experts": (("adapter",), {"lora": ('target_parameters = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]',)}),
    # the critic's cold start: 4x the pre-training rollouts
    "critic_512": (("shared", "adapter"), {"critic": ("pretrain_rollouts_override",)}),
    # advantage normalisation and a running-mean baseline (learner/config.py)
    "adv_norm": (("shared", "adapter"), {"learner": ('advantage_norm = "running"',)}),
    "mean_baseline": (("shared", "adapter"), {"learner": ('baseline = "running_mean"',)}),
}
FIELDS = ("lever", "objective", "mode", "seed", "mean_reward", "lift", "before", "after", "ratings_to_effect", "leak", "seconds")


def _spec_knobs(lever: str) -> dict:
    knobs = dict(LEVERS[lever][1])
    if knobs.get("critic") == ("pretrain_rollouts_override",):  # a count, not a [critic] line
        return {"pretrain_rollouts": 512}
    return {k: tuple(v) for k, v in knobs.items()}


def _critic_key(lever: str) -> str:
    knobs = _spec_knobs(lever)
    return json.dumps([knobs.get("pretrain_rollouts"), knobs.get("critic")])


def _one(model_dir: str, cache: str, lever: str, objective: str, mode: str, seed: int, budget: int) -> dict:
    from liveloop.experiments.uptake import UptakeSpec, cached_critic, uptake

    spec = UptakeSpec(objective, mode, seed=seed, max_ratings=budget, stop_at_effect=False, **_spec_knobs(lever))
    critic_dir, ev = cached_critic(Path(cache), Path(model_dir), spec)
    with tempfile.TemporaryDirectory() as tmp:
        run = uptake(Path(tmp) / "run", Path(model_dir), spec, critic_from=critic_dir, critic_ev=ev)
    row = {"lever": lever, "objective": objective, "mode": mode, "seed": seed, "mean_reward": sum(run.rewards) / len(run.rewards),
           "lift": run.after - run.before, "before": run.before, "after": run.after, "ratings_to_effect": run.ratings_to_effect,
           "leak": run.leak, "seconds": run.seconds, "critic_ev": ev, "final_metrics": run.final_metrics}
    print(json.dumps({k: row[k] for k in FIELDS}), flush=True)
    return row


def _warm(model_dir: str, cache: str, lever: str, objective: str, seed: int) -> None:
    """Fit (or find) the pre-trained critic a run will copy, before the runs that share it start."""
    from liveloop.experiments.uptake import UptakeSpec, cached_critic

    cached_critic(Path(cache), Path(model_dir), UptakeSpec(objective, "shared", seed=seed, **_spec_knobs(lever)))


def _logged(paths: list[str]) -> list[dict]:
    return logged_rows(paths, ("lever", "objective", "mode", "seed"))


def summarize(rows: list[dict]) -> list[dict]:
    """Per (lever, objective, mode): means, and the paired difference to the baseline's run on the same
    seed with a 95% t-interval (seeds where either is missing are left out)."""
    from liveloop.experiments.intervals import mean_ci

    base = {(r["objective"], r["mode"], r["seed"]): r for r in rows if r["lever"] == "baseline"}
    out = []
    for key in dict.fromkeys((r["lever"], r["objective"], r["mode"]) for r in rows):
        runs = [r for r in rows if (r["lever"], r["objective"], r["mode"]) == key]
        paired = [(r, base[(r["objective"], r["mode"], r["seed"])]) for r in runs if (r["objective"], r["mode"], r["seed"]) in base]
        entry = {"lever": key[0], "objective": key[1], "mode": key[2], "seeds": len(runs),
                 "mean_reward": mean_ci([r["mean_reward"] for r in runs]), "lift": mean_ci([r["lift"] for r in runs]),
                 "reached": sum(r["ratings_to_effect"] is not None for r in runs)}
        if key[0] != "baseline" and len(paired) >= 2:
            entry["d_mean_reward"] = mean_ci([r["mean_reward"] - b["mean_reward"] for r, b in paired])
            entry["d_lift"] = mean_ci([r["lift"] - b["lift"] for r, b in paired])
        out.append(entry)
    return out


def table(summary: list[dict]) -> str:
    lines = ["| lever | objective | learning | mean reward over the budget | vs baseline (paired, 95%) | probe lift | vs baseline | seeds at effect |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['lever']} | `{s['objective']}` | {s['mode']} | {s['mean_reward']} | {s.get('d_mean_reward', '')} | "
                     f"{s['lift']} | {s.get('d_lift', '')} | {s['reached']}/{s['seeds']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levers", nargs="+", default=["baseline", "lr_ceiling", "step_target", "kl_loose"])
    parser.add_argument("--shared-levers", nargs="*", default=None, help="the whole policy's levers (default: --levers)")
    parser.add_argument("--adapter-levers", nargs="*", default=None, help="the adapter's levers (default: --levers)")
    parser.add_argument("--done", nargs="*", default=[], metavar="LOG", help="skip runs these sweep logs already printed")
    parser.add_argument("--objectives", nargs="+", default=["contains:behold", "max_words:16"])
    parser.add_argument("--modes", nargs="+", default=["shared", "adapter"], choices=["shared", "adapter"])
    parser.add_argument("--shared-objectives", nargs="*", default=None, help="the whole policy's objectives (default: --objectives)")
    parser.add_argument("--adapter-objectives", nargs="*", default=None, help="the adapter's objectives (default: --objectives)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=80, help="ratings per run")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--critic-cache", default=str(Path(tempfile.gettempdir()) / "liveloop-critics"))
    parser.add_argument("--out", default="levers")
    parser.add_argument("--list", action="store_true", help="print the levers and exit")
    parser.add_argument("--summarize", nargs="*", metavar="LOG", help="only summarize the JSON rows these sweep logs printed")
    args = parser.parse_args()
    if args.summarize:
        print(table(summarize(_logged(args.summarize))))
        return
    if args.list:
        for name, (modes, knobs) in LEVERS.items():
            print(f"{name:14s} {'/'.join(modes):15s} {knobs}")
        return
    levers = {"shared": args.levers if args.shared_levers is None else args.shared_levers,
              "adapter": args.levers if args.adapter_levers is None else args.adapter_levers}
    if unknown := (set(levers["shared"]) | set(levers["adapter"])) - set(LEVERS):
        parser.error(f"unknown levers {sorted(unknown)}; --list shows them")
    model_dir = str(default_model())
    # seed-major order: the pairs of a seed finish together, so an interrupted sweep still pairs
    objectives = {"adapter": args.objectives if args.adapter_objectives is None else args.adapter_objectives,
                  "shared": args.objectives if args.shared_objectives is None else args.shared_objectives}
    done = {(r["lever"], r["objective"], r["mode"], r["seed"]) for r in _logged(args.done)}
    jobs = [(model_dir, args.critic_cache, lever, o, mode, s, args.budget) for s in args.seeds for o in args.objectives
            for mode in args.modes for lever in levers[mode]
            if mode in LEVERS[lever][0] and o in objectives[mode] and (lever, o, mode, s) not in done]
    with ProcessPoolExecutor(args.jobs) as pool:
        critics = {(_critic_key(j[2]), j[3], j[5]): j for j in jobs}  # one fit per critic the runs share
        list(pool.map(_warm, *zip(*[(m, c, lever, o, s) for (m, c, lever, o, _, s, _) in critics.values()])))
        rows = list(pool.map(_one, *zip(*jobs)))
    summary = summarize(rows)
    print(table(summary))
    print(f"saved {save(args.out, {'config': vars(args), 'summary': [{k: str(v) if hasattr(v, 'n') else v for k, v in s.items()} for s in summary], 'rows': rows})}")


if __name__ == "__main__":
    main()
