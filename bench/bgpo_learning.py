"""Held-out reward before and after offline RL of the tiny diffusion default: BGPO (n_t = 16) vs VRPO-OL
(n_t = 4, the most the paper fits in memory at scale) vs diffu-GRPO, each with the same wall-clock budget,
the same seed, prompts and sampler, starting from the same SFT'd model. Each method gets a fresh SQLite
store and checkpoint directory under a temporary directory. Reward: mean task reward of greedy samples on
held-out Countdown and Sudoku problems (seeded, disjoint seed from training).

    python bench/bgpo_learning.py [--budget 60] [--eval 48] [--learning-rate 5e-4] [--model models/liveloop-diffusion-tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, save  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=60.0, help="wall seconds of training per method")
    p.add_argument("--eval", type=int, default=48, help="held-out problems")
    p.add_argument("--model", default=None, help="starting model (default: build/reuse the tiny default)")
    p.add_argument("--config", default=str(ROOT / "configs/jobs/bgpo.toml"))
    p.add_argument("--learning-rate", type=float, default=None, help="override [bgpo] learning_rate")
    args = p.parse_args()
    import torch

    from liveloop.diffusion import tasks
    from liveloop.diffusion.bgpo import latest_checkpoint, run_bgpo
    from liveloop.diffusion.config import load_bgpo_config
    from liveloop.diffusion.model import load_diffusion_model
    from liveloop.diffusion.sft import ensure_diffusion_model, evaluate
    from liveloop.store.config import StoreConfig

    torch.set_num_threads(1)
    base = load_bgpo_config(args.config)
    model_dir = Path(args.model) if args.model else ensure_diffusion_model(base.build, ROOT / base.build.out_dir)
    held_out = tasks.dataset(base.bgpo.tasks, args.eval, seed=123_457)
    greedy = dataclasses.replace(base.sampler, temperature=0.0)

    def score(path: Path) -> float:
        model, tok = load_diffusion_model(path)
        return evaluate(model, tok, held_out, greedy, seed=0)

    before = score(model_dir)
    print(f"before: held-out reward {before:.4f}", flush=True)
    methods = {"bgpo_nt16": ("bgpo", 16), "vrpo_ol_nt4": ("vrpo_ol", 4), "diffu_grpo": ("diffu_grpo", 1)}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (loss, n_t) in methods.items():
            d = Path(tmp) / name
            job = dataclasses.replace(
                base,
                bgpo=dataclasses.replace(base.bgpo, model_dir=str(model_dir), out_dir=str(d / "out"), loss=loss,
                                         n_t=n_t, prompt_source="tasks", steps=10_000, publish_every=10_000,
                                         store_rollouts=False,
                                         learning_rate=args.learning_rate or base.bgpo.learning_rate),
                store=StoreConfig(url=f"sqlite:///{d / 'store.db'}"),
            )
            out = run_bgpo(job, progress=False, max_seconds=args.budget)
            after = score(latest_checkpoint(d / "out"))
            rows[name] = {"loss": loss, "n_t": n_t, "steps": out["step"], "after": after, "gain": after - before,
                          "train_reward_last_step": out.get("bgpo/reward_mean")}
            print(f"{name}: {out['step']} steps in {args.budget:.0f}s, held-out reward {after:.4f} "
                  f"({after - before:+.4f})", flush=True)
    path = save("bgpo_learning", {"budget_seconds": args.budget, "held_out": args.eval, "before": before,
                                  "learning_rate": args.learning_rate or base.bgpo.learning_rate,
                                  "model": str(model_dir), "methods": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
