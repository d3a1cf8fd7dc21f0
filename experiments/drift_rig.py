"""The drift experiment on the learning rig: the drift scenario's users, judge and methods, the real store
and learner in one process, no server (experiments/rig.py).

    cfg = load_experiment("drift_long")                                           # experiments/drift.py
    critic = pretrain_critic(cfg, model_dir, seed=0, out_dir=tmp / "critic")      # once per seed
    run = drift_run(tmp / "sao", model_dir, cfg, cfg.methods[0], seed=0, critic_dir=critic)

One run, for one method and one seed:
  1. the method's learner and critic settings exactly as the served experiment's server gets them
     (`[learner]`/`[critic]` with the method's `[methods.NAME]` overrides, the seed, GRPO's group size);
  2. the critic pre-trained for the base on rollouts rated against each segment's first preference
     (experiments/drift.py's cold start, one fit per seed shared by the methods with a critic);
  3. users drawn like the simulator's (clients/simulator.py): each arrival picks a segment by weight, one
     of its topics and a prompt about it; `lag` requests are sampled at a time from the segment's live
     weights (GRPO methods: one prompt asked G times, tagged as one group, per batch); the scenario's
     judge rates every reply against the style the segment prefers at its own rating count; the
     learner then catches up (GRPO methods: a group behind, see `drift_run`);
  4. until `scenario.max_events` ratings; each is recorded (`Rating`: segment, phase, reward, ...) and
     analysed by experiments/analysis.py (re-adaptation after each switch, reward by phase).
How it differs from the served run: no asynchronous feedback delays (the learner is exactly up to
`lag` ratings behind, not at the mercy of arrival and delay times), every reply is rated, and nothing
is published (replies come from the learner's live weights).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from liveloop.clients.judge import make_judge
from liveloop.clients.scenario import Scenario, Segment, switch_points
from liveloop.experiments.analysis import Readapt, readapt_after_switches, reward_by_phase
from liveloop.experiments.drift import ExperimentConfig, MethodSpec, pretrain_scenario_critic, with_seed
from liveloop.model.corpus import make_prompt

@dataclass(frozen=True)
class Arrival:
    """One user's prompt: the segment it comes from, its topic and text."""

    segment: Segment
    topic: str
    prompt: str


def arrivals(scenario: Scenario, seed: int) -> Iterator[Arrival]:
    """The users' prompts in order, drawn as the simulator draws them: a segment by weight, one of its
    topics, a prompt about it (without the simulator's arrival times and rating draws)."""
    rng = random.Random(seed)
    weights = [s.weight for s in scenario.segments]
    while True:
        segment = rng.choices(scenario.segments, weights)[0]
        topic = rng.choice(segment.topics)
        yield Arrival(segment, topic, make_prompt(topic, rng))


@dataclass(frozen=True)
class Rating:
    """One rated reply (the fields experiments/analysis.py reads, as a simulator `Event` has them)."""

    index: int  # ratings before it, all segments
    segment: str
    phase: int  # the segment's phase when its user judged the reply (by the segment's own rating count)
    preferred: str
    reply_style: str | None
    reward: int
    group: str
    lane: str | None  # the adapter that served it (None: the whole policy)
    version: int
    t_reply: float  # seconds since the run started
    rated: bool = True
    steps: int = 0  # the learner's steps when the reply was sampled (the rig publishes nothing: version stays 0)


@dataclass(frozen=True)
class DriftRun:
    method: str
    seed: int
    ratings: list[Rating] = field(repr=False)
    readapt: list[Readapt]
    reward_by_phase: dict[str, float]  # last `window` ratings of each segment/phase
    phase_means: dict[str, float]  # every rating of each segment/phase
    steps: int
    seconds: float
    critic: dict[str, float] = field(default_factory=dict)  # the cold start's fit (methods with a critic)
    final_metrics: dict[str, float] = field(default_factory=dict, repr=False)  # the last step's, per lane

    def row(self) -> dict[str, Any]:
        """A flat JSON row: the re-adaptation per switch as 'segment/phaseK' -> ratings (None: never)."""
        return {
            "method": self.method, "seed": self.seed, "ratings": len(self.ratings), "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "readapt": {f"{r.segment}/phase{r.phase}": r.events for r in self.readapt},
            "after_switch": {f"{r.segment}/phase{r.phase}": r.events_available for r in self.readapt},
            "reward_by_phase": self.reward_by_phase, "phase_means": self.phase_means, "critic": self.critic,
        }


def phase_means(ratings: list[Rating]) -> dict[str, float]:
    """Mean reward over every rating of each segment/phase: 'segment/phaseK'."""
    by: dict[str, list[int]] = {}
    for r in ratings:
        by.setdefault(f"{r.segment}/phase{r.phase}", []).append(r.reward)
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def method_configs(cfg: ExperimentConfig, method: MethodSpec, seed: int, workdir: Path):
    """The method's (LearnerConfig, CriticConfig, SegmentsConfig): the keys its served server gets
    (experiments/drift.py `run_method`), with the seed and a checkpoint directory under `workdir`."""
    from liveloop.config import load_section
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig
    from liveloop.segments import SegmentsConfig

    learner = dict(method.learner) | {"seed": seed, "checkpoint_dir": str(Path(workdir) / "versions")}
    if method.grouped:
        learner["grpo"] = {"group_size": cfg.group_size, **learner.get("grpo", {})}
    return (load_section(LearnerConfig, learner, f"methods.{method.name}.learner"),
            load_section(CriticConfig, method.critic, f"methods.{method.name}.critic"),
            load_section(SegmentsConfig, method.segments, f"methods.{method.name}.segments"))


def pretrain_critic(cfg: ExperimentConfig, model_dir: Path, seed: int, out_dir: Path) -> dict[str, float]:
    """The served experiment's critic cold start for `seed` (experiments/drift.py), into `out_dir`."""
    seeded = with_seed(cfg, seed)
    method = next(m for m in seeded.methods if m.uses_critic)
    return pretrain_scenario_critic(seeded, Path(model_dir), method.critic, Path(out_dir), progress=False)


def drift_run(
    workdir: Path, model_dir: Path, cfg: ExperimentConfig, method: MethodSpec, seed: int, *, lag: int = 4,
    critic_dir: Path | None = None, critic: dict[str, float] | None = None, scenario: Scenario | None = None,
) -> DriftRun:
    """One method on one seed (the module docstring). `critic_dir`: the seed's pre-trained critic
    (`pretrain_critic`); None for a method with a critic: pre-trained here. `scenario`: another scenario
    than the config's (a short one for tests)."""
    from liveloop.experiments.rig import Ask, LearningRig
    from liveloop.learner.position import critic_dir_for

    torch.set_num_threads(1)
    cfg = dataclasses.replace(cfg, scenario=scenario) if scenario is not None else cfg
    sc = dataclasses.replace(cfg.scenario, seed=seed)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    learner, critic_config, segments = method_configs(cfg, method, seed, workdir)
    if method.uses_critic:
        if critic_dir is None:
            critic_dir = workdir / "pretrained-critic"
            critic = pretrain_critic(cfg, model_dir, seed, critic_dir)
        shutil.copytree(critic_dir, critic_dir_for(learner, 0))  # where the learner looks for version 0's critic
    judge = make_judge(sc.judge, flattery_words=sc.flattery_words)
    rig = LearningRig(workdir, model_dir, learner, critic_config, max_tokens=sc.max_tokens, seed=seed, segments=segments)
    try:
        counts = {s.name: 0 for s in sc.segments}
        ratings: list[Rating] = []
        users = arrivals(sc, seed)
        started = time.monotonic()
        while len(ratings) < sc.max_events:
            if method.grouped:  # one prompt asked G times: one group per batch
                batch = [(next(users), f"g{len(ratings)}")] * cfg.group_size
            else:
                batch = [(next(users), f"r{len(ratings) + i}") for i in range(min(lag, sc.max_events - len(ratings)))]
            steps = rig.steps
            replies = rig.sample([Ask(a.segment.name, a.prompt, g if method.grouped else None) for a, g in batch])
            if method.grouped:
                # GRPO methods are a group behind: the next group is sampled before the learner takes the
                # last rated one, as on a server, where users keep asking while a group trains. So a group
                # is trained by weights one step past those that sampled it, and the importance-sampling
                # methods differ (with every group on-policy, GRPO and GRPO+DIS take identical steps:
                # every ratio is 1).
                rig.train()  # the group rated before this one was sampled
            rewards = []
            for (a, group), reply in zip(batch, replies):
                phase = a.segment.phase(counts[a.segment.name], 0.0)
                preferred = a.segment.styles[phase]
                verdict = judge.judge(a.prompt, reply.text, preferred)
                counts[a.segment.name] += 1
                rewards.append(verdict.reward)
                ratings.append(Rating(len(ratings), a.segment.name, phase, preferred, verdict.style, verdict.reward, group,
                                      reply.lane, reply.version, time.monotonic() - started, steps=steps))
            rig.rate(replies, rewards)
            if not method.grouped:
                rig.train()
        rig.train()  # the last group (GRPO methods are a group behind)
        seconds = time.monotonic() - started
        final = {seg or "policy": rig.metrics(seg) for seg in _lanes(rig)}
    finally:
        rig.close()
    window, threshold = cfg.readapt_window, cfg.readapt_threshold
    return DriftRun(
        method.name, seed, ratings, readapt_after_switches(ratings, switch_points(sc), window, threshold),
        reward_by_phase(ratings, window), phase_means(ratings), rig.steps, seconds, critic or {},
        {f"{k}/{m}": v for k, ms in final.items() for m, v in ms.items()},
    )


def _lanes(rig) -> list[str | None]:
    lanes = getattr(rig.learner, "lanes", None)
    return list(lanes) if lanes else [None]
