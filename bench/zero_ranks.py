"""One policy step under DeepSpeed ZeRO on 1 rank against 2 ranks (learner/ranks.py), side by side.

Each arm is a process of its own (a process is rank 0 of one group for its life): it builds the policy
optimizer (1 rank: ZeroOptimizer in its own one-process group; 2 ranks: a RankGroup, rank 1 spawned),
then runs S policy steps (`ranks.train_share`: forward, SAO loss, backward, ZeRO reduction and step,
the step's KL) on one fixed batch of B random ratings, the first excluded as warm-up. Reported per arm:
the median step time and, from cProfile on rank 0, where that time goes (forward passes, backward,
the optimizer step, and time waiting in gloo collectives).

    .venv/bin/python bench/zero_ranks.py                       # stages 2 and 3, B = 8, S = 8, tiny model
    .venv/bin/python bench/zero_ranks.py --stages 3 --batch 16 --steps 12

Writes bench/results/zero_ranks.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_model, save  # noqa: E402  (bench/ is not a package)

PHASES = {  # (file ending, function) in cProfile -> phase (cumulative seconds per step on rank 0)
    ("learner/objective.py", "policy_objective"): "forward + loss",
    ("deepspeed/runtime/engine.py", "backward"): "backward (engine.backward, with ZeRO's gradient reduction)",
    ("rl/optim.py", "_grad_norm"): "gradient norm before the step (gathered)",
    ("deepspeed/runtime/engine.py", "step"): "optimizer step (engine.step)",
    ("torch/distributed/distributed_c10d.py", "all_reduce"): "  in gloo all_reduce (incl. waiting for the other rank)",
    ("torch/distributed/distributed_c10d.py", "reduce_scatter_tensor"): "  in gloo reduce_scatter",
    ("torch/distributed/distributed_c10d.py", "all_gather_into_tensor"): "  in gloo all_gather",
    ("learner/ranks.py", "reduce_metrics"): "metrics reduced over the ranks",
}


def _batch(n: int):
    import numpy as np

    from liveloop.rl.batch import Sample, make_batch

    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        p, r = int(rng.integers(4, 12)), int(rng.integers(8, 24))
        samples.append(
            Sample(rng.integers(5, 500, p), rng.integers(5, 500, r), np.full(r, -3.0, np.float32), np.ones(r, np.uint8), float(i % 2), 0)
        )
    batch = make_batch(samples)
    return batch, torch.linspace(-1, 1, batch.width).expand_as(batch.action_mask) * batch.action_mask


def arm(stage: int, ranks: int, batch_size: int, steps: int, out: str) -> None:
    """One arm, in this process (rank 0)."""
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.methods import make_method
    from liveloop.learner.placement import placement
    from liveloop.learner.ranks import RankGroup, Step, micro_batch, train_share
    from liveloop.rl.optim import ZeroOptimizer

    torch.set_num_threads(1)
    model_dir = str(default_model())
    config = LearnerConfig(zero_stage=stage, ranks=ranks, batch_size=batch_size, device="cpu", learning_rate=1e-5)
    batch, advantages = _batch(batch_size)
    staleness = torch.zeros_like(batch.versions)
    policy = placement(config).load_causal_lm(model_dir)
    group = None
    if ranks > 1:
        group = RankGroup.start(config)
        opt = group.optimizer(policy, model_dir, config.learning_rate, config)
        step = lambda: opt.train(batch, advantages, staleness, None, 0.0)  # noqa: E731
    else:
        inner = ZeroOptimizer(policy, config.learning_rate, config.max_grad_norm, stage, micro_batch(config, 1))
        method = make_method(config)
        step = lambda: train_share(inner, method, config, Step(batch, advantages, staleness, None, 0.0, 1.0), 1)  # noqa: E731
    step()  # warm-up
    times = []
    profile = cProfile.Profile()
    for _ in range(steps):
        t = time.perf_counter()
        profile.enable()
        norm, _ = step()
        profile.disable()
        times.append(time.perf_counter() - t)
        assert norm is not None
    stats = pstats.Stats(profile)
    phases: dict[str, float] = {}
    for (file, _, name), row in stats.stats.items():  # type: ignore[attr-defined]
        for (ending, function), phase in PHASES.items():
            if name == function and file.endswith(ending):
                phases[phase] = phases.get(phase, 0.0) + row[3] / steps
    Path(out).write_text(json.dumps({"stage": stage, "ranks": ranks, "step_seconds": times, "phases_per_step": phases}))
    if group is not None:
        group.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--arm", help=argparse.SUPPRESS)  # internal: "stage,ranks,out"
    args = ap.parse_args()
    if args.arm:
        stage, ranks, out = args.arm.split(",")
        arm(int(stage), int(ranks), args.batch, args.steps, out)
        return
    rows = []
    for stage in (int(s) for s in args.stages.split(",")):
        for ranks in (1, 2):
            out = Path(f"/tmp/zero_ranks_{stage}_{ranks}.json")
            cmd = [sys.executable, __file__, "--batch", str(args.batch), "--steps", str(args.steps), "--arm", f"{stage},{ranks},{out}"]
            subprocess.run(cmd, check=True, timeout=900)
            rows.append(json.loads(out.read_text()))
            out.unlink()
    print(f"B = {args.batch}, {args.steps} steps per arm (median step seconds; ratio 2 ranks / 1 rank)")
    result = {"batch": args.batch, "steps": args.steps, "arms": rows}
    for stage in sorted({r["stage"] for r in rows}):
        one, two = (next(r for r in rows if r["stage"] == stage and r["ranks"] == n) for n in (1, 2))
        m1, m2 = statistics.median(one["step_seconds"]), statistics.median(two["step_seconds"])
        result[f"ratio_stage{stage}"] = m2 / m1
        print(f"ZeRO-{stage}: 1 rank {m1 * 1000:.0f} ms, 2 ranks {m2 * 1000:.0f} ms, ratio {m2 / m1:.2f}")
        for phase in PHASES.values():
            a, b = one["phases_per_step"].get(phase), two["phases_per_step"].get(phase)
            if a is not None or b is not None:
                print(f"    {phase:62s} {1000 * (a or 0):7.0f} ms  {1000 * (b or 0):7.0f} ms")
    print("wrote", save("zero_ranks", result))


if __name__ == "__main__":
    main()
