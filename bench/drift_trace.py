"""One drift-rig run of `sao_adapters` (configs/experiments/drift_long.toml) with every lane step's metrics traced:
what a segment's adapter does around its preference switch (its rate, step size, KL, the critic's value
error, restarts), where bench/drift_seeds.py keeps only the re-adaptation counts.

    .venv/bin/python bench/drift_trace.py --seed 0 --out bench/results/drift_trace_s0.json
    .venv/bin/python bench/drift_trace.py --seed 0 --lora restart_critic=true --out ...

`--lora KEY=JSON ...` overrides `[learner.lora]` keys of the method (a lever), `--learner KEY=JSON ...`
`[learner]` keys (every lane's). The output holds the run's
row (as bench/drift_seeds.py writes it), the trace (one entry per lane step) and every rating.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from common import default_model  # noqa: E402

KEYS = ("learner/reward_mean", "learner/lr", "learner/kl", "learner/step_kl", "learner/restarts",
        "learner/advantage_positive_fraction", "critic/value_error", "learner/entropy", "learner/kl_coef",
        "learner/restart_window_mean", "learner/advantage_scale")


def _overrides(pairs: list[str]) -> dict:
    """KEY=JSON arguments as a dict (`restart_window=0` -> {"restart_window": 0})."""
    return {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in pairs)}


def main() -> None:
    from liveloop.experiments.drift import load_experiment
    from liveloop.experiments.drift_rig import drift_run
    from liveloop.learner.online import OnlineLearner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="drift_long")
    parser.add_argument("--lora", nargs="*", default=[], help="KEY=JSON overrides of [learner.lora]")
    parser.add_argument("--learner", nargs="*", default=[], help="KEY=JSON overrides of [learner]")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/liveloop-drift-trace"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)

    trace: list[dict] = []
    step = OnlineLearner.step

    def traced(self) -> bool:  # the learner's own step, its metrics recorded after
        stepped = step(self)
        if stepped:
            m = self.state.last_metrics
            trace.append({"segment": self.segment, "step": self.state.step, **{k: m.get(k) for k in KEYS}})
        return stepped

    OnlineLearner.step = traced
    cfg = load_experiment(args.config, only=["sao_adapters"])
    method = cfg.methods[0]
    if args.lora:
        lora = dict(method.learner.get("lora", {})) | _overrides(args.lora)
        method = dataclasses.replace(method, learner=dict(method.learner) | {"lora": lora})
    if args.learner:
        method = dataclasses.replace(method, learner=dict(method.learner) | _overrides(args.learner))
    started = time.monotonic()
    run = drift_run(args.workdir / f"s{args.seed}", default_model(), cfg, method, args.seed, lag=4)
    row = run.row() | {"lora_overrides": args.lora, "learner_overrides": args.learner, "wall_seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"row": row, "trace": trace, "ratings": [dataclasses.asdict(r) for r in run.ratings]}))


if __name__ == "__main__":
    main()
