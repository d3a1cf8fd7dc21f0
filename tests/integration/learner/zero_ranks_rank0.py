"""Rank 0 of the 2-rank runs of test_zero_ranks.py, as a process of its own (a process becomes rank 0
of one torch.distributed group for its life, so the test process cannot be it). One process, one
group, every run in turn (each process start costs the imports and the group's start-up):

    python zero_ranks_rank0.py RUNS.json OUT.pt

RUNS.json: a list of {"mode": "step", "config": {...}, "model_dir", "inputs"} (one policy step on the
batch in `inputs`, then the weights gathered twice, as two publishes would) and {"mode": "learn",
"config": {...}, "model_dir", "db"} (the online learner: one step on the store's ratings, published) and
{"mode": "listening", "config": {...}} (the addresses the group's processes listen on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def step(config, model_dir: str, inputs: str) -> dict:
    from liveloop.learner.placement import placement
    from liveloop.learner.ranks import RankGroup

    batch, advantages = torch.load(inputs, weights_only=False)
    group = RankGroup.start(config)
    policy = placement(config).load_causal_lm(model_dir)
    opt = group.optimizer(policy, model_dir, config.learning_rate, config)
    norm, metrics = opt.train(batch, advantages, torch.zeros_like(batch.versions), None, 0.0)
    gathered = []
    for _ in range(2):  # publishing twice reads the same complete weights
        with opt.full_parameters() as full:
            gathered.append({k: v.detach().clone() for k, v in full.state_dict().items()})
    return {"norm": norm, "metrics": metrics, "gathered": gathered}


def learn(config, model_dir: str, db: str) -> dict:
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.online import OnlineLearner
    from liveloop.store import Store, StoreConfig

    store = Store(StoreConfig(url=f"sqlite:///{db}"))
    learner = OnlineLearner.resume(
        config, CriticConfig(), Path(model_dir),
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    learner.run(lambda: False, max_steps=1)
    state = learner.state
    store.close()
    return {"skipped_steps": state.skipped_steps, "samples": state.samples, "metrics": state.last_metrics}


def listening(config) -> dict:
    """The addresses the group's processes (rank 0 and its workers) listen on, while the group is up."""
    import psutil

    from liveloop.learner.ranks import RankGroup

    group = RankGroup.start(config)
    procs = [psutil.Process(), *(psutil.Process(p.pid) for p in group.processes)]
    return {"listening": sorted({c.laddr.ip for p in procs for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN})}


def main(runs_path: str, out: str) -> None:
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.ranks import RankGroup

    torch.set_num_threads(1)
    results = []
    for run in json.loads(Path(runs_path).read_text()):
        config = LearnerConfig(**run.pop("config"))
        mode = run.pop("mode")
        results.append({"step": step, "learn": learn, "listening": listening}[mode](config, **run))
    RankGroup.start(config).close()
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
