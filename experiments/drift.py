"""`liveloop experiment drift`: the same preference-drift scenario, same seeds, for each learning method,
each against a fresh real server + co-located learner, and a report.

    out = run_drift(load_experiment(None), Path("results"))       # the embedded default

1. the results directory: <out>/drift-<UTC date and time>-<config hash>/ with the config it ran;
2. for the methods with a critic, pre-train one critic on rollouts of the base model rated by the
   scenario's judge against each segment's first preference (SAO's cold start), shared by them;
3. per method: start a server (`devtools.start_server`) with the method's `[learner]`/`[critic]`, run the
   simulated users (GRPO methods ask each prompt G times), read the learner's status (idle time, GRPO
   group wait) and the versions, stop the server; events go to `events-<method>.jsonl`;
4. the report (`report.write_report`): plots, `summary.md`, `results.json`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from liveloop.clients.judge import make_judge
from liveloop.clients.scenario import Scenario, ScenarioError, parse_scenario
from liveloop.clients.simulator import Simulator, write_events

# The embedded default. Sized so that all seven methods run in about 20-25 minutes on a 2-core machine
# (a server with its learner takes ~1 minute to start there): short phases. For longer runs raise
# scenario.max_events and each segment's switch_at together (`--config` a copy of this file).
DEFAULT_CONFIG = """
[experiment]
methods = ["sao", "sao_k1", "sao_unfrozen", "sao_no_kl", "sliding_window", "grpo", "grpo_dis"]
group_size = 4              # G for the GRPO methods: each prompt is asked G times
readapt_window = 20         # moving-average window (a segment's feedback events) for re-adaptation
readapt_threshold = 0.5     # re-adapted: the window's mean reward back at or above this
pretrain_rollouts = 96      # critic cold start (methods with a critic), rated by the scenario's judge
pretrain_ev_threshold = 0.5
pretrain_max_epochs = 20
backend = "vllm"
model = "models/liveloop-tiny"
server_timeout = 300

# [learner] / [critic] shared by every method; [methods.NAME] overrides them per method.
[learner]
batch_size = 1
publish_every_steps = 4
publish_every_seconds = 2.0
learning_rate = 1e-3
lambda_alpha = 0.05
kl_coef = 0.1
window = 256

[critic]
value_steps = 2
freeze_attention = true

[methods.sao]
[methods.sao_k1]
critic = { value_steps = 1 }
[methods.sao_unfrozen]
critic = { freeze_attention = false }
[methods.sao_no_kl]
learner = { kl_coef = 0.0 }
[methods.sliding_window]
learner = { method = "sliding_window" }
[methods.grpo]
learner = { method = "grpo" }
[methods.grpo_dis]
learner = { method = "grpo_dis" }

[scenario]
name = "drift"
seed = 0
styles = ["cute", "chuunibyou", "classical"]
max_events = 260
arrival_rate = 3.0
max_in_flight = 6
rating_probability = 0.9
max_tokens = 48
judge = "rule"

[scenario.feedback_delay]
distribution = "lognormal"
median_seconds = 0.4
sigma = 1.0
max_seconds = 15.0

[[segments]]
name = "cozy"
topics = ["cats", "bread", "music", "forests"]
styles = ["cute", "chuunibyou"]
switch_at = [60]

[[segments]]
name = "night"
topics = ["the sea", "rain", "the moon", "trains"]
styles = ["classical", "cute"]
switch_at = [70]
"""

_EXPERIMENT_KEYS = {
    "methods", "group_size", "readapt_window", "readapt_threshold", "pretrain_rollouts", "pretrain_ev_threshold",
    "pretrain_max_epochs", "backend", "model", "server_timeout",
}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    learner: dict[str, Any]
    critic: dict[str, Any]

    @property
    def uses_critic(self) -> bool:
        return self.learner.get("method", "sao") == "sao"

    @property
    def grouped(self) -> bool:
        return self.learner.get("method", "sao") in ("grpo", "grpo_dis")


@dataclass(frozen=True)
class ExperimentConfig:
    text: str  # the TOML it was loaded from (hashed into the results directory's name)
    methods: tuple[MethodSpec, ...]
    scenario: Scenario
    group_size: int = 4
    readapt_window: int = 20
    readapt_threshold: float = 0.5
    pretrain_rollouts: int = 96
    pretrain_ev_threshold: float = 0.5
    pretrain_max_epochs: int = 20
    backend: str = "vllm"
    model: str = "models/liveloop-tiny"
    server_timeout: float = 300.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:8]

    def scenario_for(self, method: MethodSpec) -> Scenario:
        return dataclasses.replace(self.scenario, group_size=self.group_size if method.grouped else 1)


class ExperimentError(ValueError):
    """The experiment config is invalid; the message names the key."""


def load_experiment(path: str | Path | None, only: list[str] | None = None, default: str = DEFAULT_CONFIG) -> ExperimentConfig:
    """The embedded default (path None) or a TOML file of the same shape; `only` keeps those methods."""
    if path is None:
        text = default
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ExperimentError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(f"{path or 'default config'}: not valid TOML: {exc}") from exc
    exp = data.get("experiment", {})
    for key in exp:
        if key not in _EXPERIMENT_KEYS:
            raise ExperimentError(f"experiment.{key}: unknown key (known: {', '.join(sorted(_EXPERIMENT_KEYS))})")
    try:
        scenario = parse_scenario({k: data[k] for k in ("scenario", "segments") if k in data})
    except ScenarioError as exc:
        raise ExperimentError(str(exc)) from exc
    base_learner, base_critic = data.get("learner", {}), data.get("critic", {})
    table = data.get("methods", {})
    names = list(exp.get("methods", list(table)))
    if only:
        unknown = [m for m in only if m not in names and m not in table]
        if unknown:
            raise ExperimentError(f"--methods: unknown {unknown} (known: {', '.join(table)})")
        names = only
    methods = []
    for name in names:
        if name not in table:
            raise ExperimentError(f"experiment.methods: {name!r} has no [methods.{name}] table")
        spec = table[name]
        for key in spec:
            if key not in ("learner", "critic"):
                raise ExperimentError(f"methods.{name}.{key}: unknown key (known: critic, learner)")
        methods.append(MethodSpec(name, {**base_learner, **spec.get("learner", {})}, {**base_critic, **spec.get("critic", {})}))
    _check_sections(methods)
    kw = {k: exp[k] for k in _EXPERIMENT_KEYS - {"methods"} if k in exp}
    return ExperimentConfig(text=text, methods=tuple(methods), scenario=scenario, **kw)


def _check_sections(methods: list[MethodSpec]) -> None:
    """Every method's [learner]/[critic] must load as the server will load it."""
    from liveloop.config import ConfigError, load_section
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig

    for m in methods:
        try:
            load_section(LearnerConfig, m.learner, f"methods.{m.name}.learner")
            load_section(CriticConfig, m.critic, f"methods.{m.name}.critic")
        except ConfigError as exc:
            raise ExperimentError(str(exc)) from exc


def toml_table(values: dict[str, Any]) -> str:
    """Flat key = value lines (str, bool, int, float) for a TOML section body."""
    lines = []
    for k, v in values.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            lines.append(f"{k} = {v!r}")
        elif isinstance(v, str):
            lines.append(f"{k} = {json.dumps(v)}")
        else:
            raise ExperimentError(f"{k}: only str, bool, int and float values are supported here, got {type(v).__name__}")
    return "\n".join(lines)


# -- critic cold start --------------------------------------------------------------------------

def pretrain_scenario_critic(cfg: ExperimentConfig, model_dir: Path, critic: dict[str, Any], out_dir: Path, progress: bool) -> dict[str, float]:
    """Rollouts of the base model on each segment's prompts, rated by the judge against the segment's
    first preference (what users rate before any switch), fitted by the critic's pre-training."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.checkpoint import save_atomically
    from liveloop.critic.config import CriticConfig
    from liveloop.critic.pretrain import pretrain_critic
    from liveloop.critic.trainer import Critic
    from liveloop.critic.value_model import build_value_model
    from liveloop.learner.batch import Sample
    from liveloop.learner.rollout import chat_prompt_ids, sample_reply
    from liveloop.model.corpus import make_prompt

    sc = cfg.scenario
    judge = make_judge(sc.judge)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    rng, gen = random.Random(sc.seed + 1), torch.Generator().manual_seed(sc.seed + 1)
    samples = []
    for i in range(cfg.pretrain_rollouts):
        segment = sc.segments[i % len(sc.segments)]
        prompt = make_prompt(rng.choice(segment.topics), rng)
        r = sample_reply(policy, tok, chat_prompt_ids(tok, prompt), sc.max_tokens, gen, sc.temperature)
        samples.append(Sample.from_rollout(r, float(judge.judge(prompt, r.text, segment.styles[0]).reward)))
    critic_cfg = CriticConfig(**critic)
    torch.manual_seed(0)
    model = Critic(build_value_model(str(model_dir)), critic_cfg)
    result = pretrain_critic(model, samples, cfg.pretrain_ev_threshold, cfg.pretrain_max_epochs, progress=progress)
    save_atomically(out_dir, lambda tmp: model.save(str(tmp)))
    return result | {"critic/pretrain_reward_rate": sum(s.reward for s in samples) / len(samples)}


# -- one method ------------------------------------------------------------------------------------

@dataclass
class MethodRun:
    name: str
    events: list[Any]
    learner: dict[str, Any]  # /admin/learner at the end of the simulation (before the server stops)
    versions: list[dict[str, Any]]
    start_seconds: float
    sim_seconds: float
    error: str | None = None


def run_method(cfg: ExperimentConfig, method: MethodSpec, workdir: Path, model_dir: Path, critic_dir: Path | None, progress: bool) -> MethodRun:
    from liveloop import devtools
    from liveloop.learner.config import LearnerConfig
    from liveloop.learner.online import critic_dir_for

    workdir.mkdir(parents=True, exist_ok=True)
    learner = dict(method.learner)
    if method.grouped:
        learner.setdefault("group_size", cfg.group_size)
    if critic_dir is not None and method.uses_critic:  # where the learner looks for version 0's critic
        target = critic_dir_for(LearnerConfig(checkpoint_dir=str(workdir / "versions")), 0)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(critic_dir, target)
    t0 = time.monotonic()
    server = devtools.start_server(
        workdir, model_dir, cfg.backend, timeout=cfg.server_timeout, learner=toml_table(learner),
        extra="[critic]\n" + toml_table(method.critic),
    )
    started = time.monotonic() - t0
    admin = {"Authorization": f"Bearer {devtools.ADMIN_KEY}"}
    try:
        sim = Simulator(cfg.scenario_for(method), server.base_url, devtools.USER_KEY, progress=sys.stderr if progress else None)
        t1 = time.monotonic()
        error = None
        try:
            asyncio.run(sim.run())
        except Exception as exc:  # a failed run is reported, the others still run
            error = f"{type(exc).__name__}: {exc}"[:500]
        sim_seconds = time.monotonic() - t1
        status = httpx.get(server.base_url + "/admin/learner", headers=admin, timeout=30).json()
        versions = httpx.get(server.base_url + "/admin/versions", headers=admin, timeout=30).json()["data"]
    finally:
        server.stop()
    return MethodRun(method.name, sim.events, status, versions, started, sim_seconds, error)


# -- the whole experiment --------------------------------------------------------------------------

def results_dir(out_root: Path, cfg: ExperimentConfig, kind: str = "drift") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(out_root) / f"{kind}-{stamp}-{cfg.digest}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def run_drift(cfg: ExperimentConfig, out_root: Path, progress: bool = True, model_dir: Path | None = None) -> Path:
    from liveloop.experiments.report import write_report

    started = time.monotonic()
    model_dir = Path(model_dir or cfg.model).resolve()
    if not (model_dir / "config.json").exists():
        raise ExperimentError(f"experiment.model: {model_dir} is not a checkpoint directory (run `liveloop model init`)")
    # 1. the results directory, with the config it ran
    out = results_dir(out_root, cfg)
    (out / "config.toml").write_text(cfg.text)
    work = out / "work"
    # 2. one critic cold start for the methods that have a critic
    critic_dir, pretrain = None, {}
    with_critic = [m for m in cfg.methods if m.uses_critic]
    if with_critic:
        _say(progress, f"[experiment] pre-training the critic on {cfg.pretrain_rollouts} rated rollouts")
        critic_dir = work / "pretrained-critic"
        pretrain = pretrain_scenario_critic(cfg, model_dir, with_critic[0].critic, critic_dir, progress)
        _say(progress, f"[experiment] critic: {json.dumps(pretrain)}")
    # 3. each method against a fresh server + learner
    runs = []
    for method in cfg.methods:
        _say(progress, f"[experiment] {method.name}: starting a server with learner {json.dumps(method.learner)} critic {json.dumps(method.critic)}")
        run = run_method(cfg, method, work / method.name, model_dir, critic_dir, progress)
        write_events(run.events, out / f"events-{method.name}.jsonl")
        (out / f"learner-{method.name}.json").write_text(json.dumps({"learner": run.learner, "versions": run.versions}, indent=1, default=str))
        _say(progress, f"[experiment] {method.name}: {len(run.events)} replies in {run.sim_seconds:.0f}s (server start {run.start_seconds:.0f}s){' ERROR ' + run.error if run.error else ''}")
        runs.append(run)
        _cleanup(work / method.name)
    # 4. the report
    write_report(out, cfg, runs, pretrain, wall_seconds=time.monotonic() - started)
    return out


def _cleanup(workdir: Path) -> None:
    """Published checkpoints are large and not part of the report: keep the server log and the store."""
    shutil.rmtree(workdir / "versions", ignore_errors=True)
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)
