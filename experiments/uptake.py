"""Ratings to effect: how many ratings a learner needs before the model it serves shows a new objective.

    run = uptake(workdir, model_dir, UptakeSpec("contains:behold", "adapter", seed=3))

One run, on the learning rig (experiments/rig.py): the users of segment "cozy" reward a rule objective
(liveloop/rewards.py) and rate every reply, `lag` replies sampled at a time from cozy's live weights;
the other segment, "night", never rates.
  1. probe: the objective's rate on 48 fixed prompts (fixed sampling seed), for cozy and for night;
  2. cozy's users ask and rate until the reward's moving average over `window` ratings reaches the
     probe's rate + `lift` (the effect; its rating count is the run's `ratings_to_effect`) or
     `max_ratings` pass;
  3. probe again, both segments, with the same prompts and seed (a paired before/after).
`mode` "shared" trains the whole policy (night is served the same weights: its change is the leak);
"adapter" trains cozy's LoRA adapter only (night keeps its own: the leak must be 0).
The critic is pre-trained for the base on the objective first (`liveloop critic pretrain`), as a
deployment that knows its objective would; `pretrained_critic` shares one fit between modes.
`learner` and `critic` are extra TOML lines over the shipped learner (the lever sweep's knobs).
"""

from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from liveloop.clients.rewards import corpus_prompt, make_reward
from liveloop.config import Config, load_config
from liveloop.experiments.rig import Ask, LearningRig, sample_batch

SEGMENT, OTHER = "cozy", "night"
PROBES = 48
SHIPPED = ("tuned_learner", "step_control")  # the shipped learner the served benchmarks and experiments run
MODES = {"shared": "", "adapter": f'adapters = "segment"\nnames = ["{SEGMENT}", "{OTHER}"]'}  # [segments] lines


@dataclass(frozen=True)
class UptakeSpec:
    objective: str
    mode: str  # shared | adapter
    seed: int = 0
    max_ratings: int = 300
    window: int = 40
    lift: float = 0.25
    lag: int = 4
    learner: tuple[str, ...] = ()  # extra [learner] lines (TOML), e.g. ("target_step_kl = 0.01",)
    critic: tuple[str, ...] = ()  # extra [critic] lines
    lora: tuple[str, ...] = ()  # extra [learner.lora] lines
    pretrain_rollouts: int = 128
    extends: tuple[str, ...] = SHIPPED  # the presets under the spec's lines (adapters: + "adapter_learning")
    stop_at_effect: bool = True  # False: rate all max_ratings (a fixed budget: the lever sweep's measure)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {sorted(MODES)}")
        make_reward(self.objective)  # a malformed objective fails here, before any model loads


@dataclass(frozen=True)
class UptakeRun:
    spec: UptakeSpec
    before: float  # cozy's probe rate before
    after: float  # and after
    other_before: float  # night's, before and after (the leak: their difference)
    other_after: float
    ratings_to_effect: int | None  # None: not within max_ratings
    ratings: int
    rewards: list[float] = field(repr=False)
    critic_ev: float | None = None
    seconds: float = 0.0
    final_metrics: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def leak(self) -> float:
        return self.other_after - self.other_before

    def row(self) -> dict:
        """A flat JSON row (the spec's fields first)."""
        out = asdict(self.spec) | {k: v for k, v in asdict(self).items() if k not in ("spec", "rewards")}
        return out | {"leak": self.leak}


def config_for(spec: UptakeSpec) -> Config:
    """The spec's presets (the shipped learner: tuned preset + step-size control) with the mode's and the
    spec's lines."""
    lines = [f"extends = {json.dumps(list(spec.extends))}", "[segments]", MODES[spec.mode], "[learner]", f"seed = {spec.seed}", *spec.learner,
             "[learner.lora]", *spec.lora, "[critic]", f'pretrain_reward = "{spec.objective}"',
             f"pretrain_rollouts = {spec.pretrain_rollouts}", "pretrain_ev_threshold = 0.5", *spec.critic]
    return load_config(text="\n".join(lines) + "\n")


def probe_prompts() -> list[str]:
    rng = random.Random(4242)
    return [corpus_prompt(i, rng) for i in range(PROBES)]


def pretrained_critic(workdir: Path, model_dir: Path, spec: UptakeSpec) -> float | None:
    """Pre-train the base's critic on the spec's objective into `workdir` (a store, and the critic where
    the learner looks for version 0's): `pretrain_rollouts` replies of the base to the corpus prompts,
    sampled 16 at a time (`rig.sample_batch`), rated by the objective; returns the fit's explained
    variance. Copy `workdir` to share the fit between runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.critic.pretrain import pretrain
    from liveloop.learner.position import critic_dir_for
    from liveloop.rl.batch import Sample
    from liveloop.rl.rollout import chat_prompt_ids
    from liveloop.store import Store, StoreConfig

    torch.set_num_threads(1)
    cfg = _with_checkpoints(config_for(spec), workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = Store(StoreConfig(url=f"sqlite:///{workdir / 'liveloop.db'}"))
    try:
        store.migrate()
        store.versions.ensure_base_version(str(Path(model_dir).resolve()))
    finally:
        store.close()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    reward, rng = make_reward(spec.objective), random.Random(spec.seed)
    generator = torch.Generator().manual_seed(spec.seed)
    samples = []
    for start in range(0, spec.pretrain_rollouts, 16):
        prompts = [chat_prompt_ids(tokenizer, corpus_prompt(start + i, rng)) for i in range(min(16, spec.pretrain_rollouts - start))]
        for rollout in sample_batch(model, tokenizer, prompts, cfg.critic.pretrain_max_tokens, generator):
            samples.append(Sample.from_rollout(rollout, reward(rollout.text)))
    result = pretrain(str(model_dir), cfg.critic, critic_dir_for(cfg.learner, 0), samples, cfg.critic.pretrain_ev_threshold,
                      cfg.critic.pretrain_max_epochs, seed=spec.seed, progress=False)
    return result.get("critic/explained_variance")


def cached_critic(root: Path, model_dir: Path, spec: UptakeSpec) -> tuple[Path, float | None]:
    """`pretrained_critic` for the spec's objective, seed and rollout count under `root`, fitted once and
    reused (the fit does not depend on the learner's knobs; a `critic` lever gets its own entry)."""
    import hashlib

    key = hashlib.sha256(json.dumps([spec.objective, spec.seed, spec.pretrain_rollouts, spec.critic]).encode()).hexdigest()[:12]
    done = Path(root) / f"{spec.objective.replace(':', '_')}-s{spec.seed}-{key}"
    if not (done / "ev.json").exists():
        staging = done.with_name(done.name + f".tmp{uuid.uuid4().hex[:6]}")
        ev = pretrained_critic(staging, model_dir, spec)
        (staging / "ev.json").write_text(json.dumps({"explained_variance": ev}))
        try:
            staging.rename(done)
        except OSError:  # another process got there first: use theirs
            shutil.rmtree(staging, ignore_errors=True)
    return done, json.loads((done / "ev.json").read_text())["explained_variance"]


def _with_checkpoints(cfg: Config, workdir: Path) -> Config:
    return cfg.with_section("learner", checkpoint_dir=str(workdir / "versions"))


def uptake(workdir: Path, model_dir: Path, spec: UptakeSpec, critic_from: Path | None = None,
           critic_ev: float | None = None) -> UptakeRun:
    """One run (the module docstring). `critic_from`: a directory `pretrained_critic` filled, copied to
    `workdir` first; None: pre-train here."""
    torch.set_num_threads(1)
    if critic_from is not None:
        shutil.copytree(critic_from, workdir)
    else:
        critic_ev = pretrained_critic(workdir, model_dir, spec)
    cfg = _with_checkpoints(config_for(spec), workdir)
    reward = make_reward(spec.objective)
    rig = LearningRig(workdir, model_dir, cfg.learner, cfg.critic, seed=spec.seed, segments=cfg.segments)
    try:
        probes = probe_prompts()
        before, other_before = rig.probe(SEGMENT, probes, reward), rig.probe(OTHER, probes, reward)
        goal = min(1.0, before + spec.lift)
        rng, rewards, reached, started = random.Random(spec.seed), [], None, time.monotonic()
        while (reached is None or not spec.stop_at_effect) and len(rewards) < spec.max_ratings:
            asks = [Ask(SEGMENT, corpus_prompt(len(rewards) + i, rng)) for i in range(spec.lag)]
            replies = rig.sample(asks)
            scores = [reward(r.text) for r in replies]
            rig.rate(replies, scores)
            for s in scores:
                rewards.append(s)
                recent = rewards[-spec.window:]
                if reached is None and len(recent) == spec.window and sum(recent) / spec.window >= goal:
                    reached = len(rewards)
            rig.train()
        seconds = time.monotonic() - started
        after, other_after = rig.probe(SEGMENT, probes, reward), rig.probe(OTHER, probes, reward)
        return UptakeRun(spec, before, after, other_before, other_after, reached, len(rewards), rewards, critic_ev,
                         seconds, rig.metrics(SEGMENT))
    finally:
        rig.close()
