"""The learner's step on one long rated sample, with and without recomputed activations: peak resident set
and seconds per step (SmolLM2 by default; the learner built as the server's actor builds it, the default
preset's [learner] and [critic], one sample of PROMPT random prompt tokens and 100 reply tokens per step).

    .venv/bin/python bench/recompute_long.py plain    # no recomputation
    .venv/bin/python bench/recompute_long.py recompute  # every step recomputed ([learner] recompute_over_tokens = 1)

One arm per process (a process's peak is its own). Prints each step's seconds, the peak since the step
began (the kernel's high-water mark, reset before it) and its step KL (the same in both arms: the same update).
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learner_real  # noqa: E402  (bench/ is not a package)
from common import ROOT  # noqa: E402

PROMPT = 1300


def main() -> None:
    from liveloop.config import load_config
    from liveloop.learner.lanes import build_learner

    arm = sys.argv[1] if len(sys.argv) > 1 else "plain"
    torch.set_num_threads(1)
    model_dir = ROOT / "models/smollm2-135m-instruct"
    rng = np.random.default_rng(0)
    rated = [(list(rng.integers(100, 40000, PROMPT)), list(rng.integers(100, 40000, 100)), [-3.0] * 100) for _ in range(3)]
    cfg = load_config("default")
    tmp = Path(tempfile.mkdtemp())
    store = learner_real.fill_store(tmp, model_dir, rated, "shared")
    learner_cfg = dataclasses.replace(cfg.learner, checkpoint_dir=str(tmp / "versions"), publish_every_steps=10**6,
                                      publish_every_seconds=1e9, max_batch_size=1,
                                      recompute_over_tokens=1 if arm == "recompute" else 0)
    learner = build_learner(learner_cfg, cfg.critic, model_dir, segments=cfg.segments, feedback=store.feedback,
                            versions=store.versions, operator=store.operator, episodes=store.episodes)
    lane = learner if not hasattr(learner, "lanes") else next(iter(learner.lanes.values()))
    for i in range(len(rated)):
        learner_real.reset_peak()
        start = time.perf_counter()
        lane.step()
        print(f"{arm} step {i}: {time.perf_counter() - start:.1f} s, peak {learner_real.peak_gib():.2f} GiB, "
              f"step KL {lane.state.last_metrics.get('learner/step_kl')}", flush=True)


if __name__ == "__main__":
    main()
