"""Evaluation cost per candidate on the tiny default model: the release gate's evaluation
(release/evaluation.py, the shipped suite configs/suites/evaluation_default.toml, `[release.evaluation]`
defaults: 24 prompts + 12 false claims, 48 tokens, 1 sample each) of successive candidates against the
live base model, each candidate loaded into the candidate engine as the gate does.

Per candidate: wall clock of the evaluation (`seconds`), the part spent waiting for the serving engines'
samples (`engine_seconds`, the candidate's and, for the first, the live version's) and its share; the
rest is the scorer's (KL and perplexity forward passes; for the first candidate also the base model's
own replies, drawn once per evaluator, and the models' loads). The first candidate pays for the live
and base values; the following ones reuse them (the live version did not change).

    .venv/bin/python bench/evaluation_cost.py [--candidates 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from common import default_model, save  # noqa: E402


async def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from liveloop.checkpoint import checkpoint_digest
    from liveloop.devtools import perturbed_checkpoint
    from liveloop.release.config import EvaluationConfig
    from liveloop.release.evaluation import Evaluator
    from liveloop.release.scoring import Scorer
    from liveloop.server.config import EngineConfig
    from liveloop.server.engines.hf.engine import HFEngine
    from liveloop.server.control.evaluating import engine_evaluation
    from liveloop.store import VersionStatus
    from liveloop.store.records import VersionRecord

    model_dir = default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    stops = (int(tokenizer.eos_token_id),)
    config = EvaluationConfig()
    now = datetime.now(timezone.utc)
    live_record = VersionRecord(0, None, now, str(model_dir), None, 0, 0)
    engine_config = EngineConfig(backend="hf", model=str(model_dir), device=args.device)
    live, candidate = HFEngine(engine_config, model_dir), HFEngine(engine_config, model_dir)
    await live.start(version=0)
    await candidate.start(version=0)
    scorer = Scorer(model_dir, device="cuda" if args.device == "cuda" else "cpu")
    evaluate = engine_evaluation(Evaluator(config, tokenizer, model_dir, stop_token_ids=stops, scorer=scorer), stops)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(1, args.candidates + 1):
                path = perturbed_checkpoint(model_dir, Path(tmp) / f"v{i}", seed=i, scale=0.05)
                await candidate.update_weights(path, i)
                record = VersionRecord(i, 0, now, str(path), checkpoint_digest(path), i, 8 * i, status=VersionStatus.CANARY)
                t = time.perf_counter()
                result = await evaluate(candidate, record, live, live_record)
                wall = time.perf_counter() - t
                rows.append({
                    "candidate": i, "seconds": round(result.seconds, 3), "engine_seconds": round(result.engine_seconds, 3),
                    "engine_share": round(result.engine_seconds / result.seconds, 3), "wall_seconds": round(wall, 3),
                    "passed": result.passed, "failed": result.failed, "scorer_loads": scorer.loads,
                })
                print(f"candidate {i}: {result.seconds:6.2f} s, engines {result.engine_seconds:5.2f} s "
                      f"({100 * result.engine_seconds / result.seconds:4.1f}%), {'passed' if result.passed else 'failed ' + str(result.failed)}, "
                      f"models loaded so far {scorer.loads}")
    finally:
        await live.close()
        await candidate.close()
    warm = rows[1:] or rows
    return {
        "suite": config.suite, "prompts": 24, "false_claims": 12, "max_tokens": config.max_tokens, "device": args.device,
        "torch_threads": torch.get_num_threads(), "candidates": rows,
        "first_seconds": rows[0]["seconds"], "warm_median_seconds": sorted(r["seconds"] for r in warm)[len(warm) // 2],
        "warm_median_engine_share": sorted(r["engine_share"] for r in warm)[len(warm) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = asyncio.run(run(args))
    print(save(f"evaluation_cost_{args.device}", result))


if __name__ == "__main__":
    main()
