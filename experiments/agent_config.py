"""The agent experiment's config (configs/experiments/agent_experiment.toml, or `--config` another preset or path):
its `[experiment]` settings, the shared `[learner]` and `[critic]`, and each method's `[methods.NAME]`
keys over them. Loading it imports no torch (the packaged presets are checked that way)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from liveloop.config import check_sections, load_section, merge, read_toml, resolve_config
from liveloop.critic.config import CriticConfig
from liveloop.experiments.drift import ExperimentError, MethodTable
from liveloop.learner.config import LearnerConfig


@dataclass(frozen=True)
class AgentSettings:
    """The `[experiment]` table (configs/experiments/agent_experiment.toml says what each is)."""

    seeds: int = 5
    episodes: int = 768
    batch: int = 8
    group_size: int = 4
    probe: int = 96
    probe_every: int = 192
    window: int = 64
    effect: float = 0.1
    max_tokens: int = 48
    model: str = "models/liveloop-tiny-agent"
    methods: tuple[str, ...] = ()  # [methods.NAME] tables to run, in this order; empty: all, in file order


SECTIONS: dict[str, Any] = {
    "experiment": AgentSettings,
    "learner": dict[str, Any],
    "critic": dict[str, Any],
    "methods": dict[str, MethodTable],
}


@dataclass(frozen=True)
class AgentExperiment(AgentSettings):
    """The loaded experiment: its settings, the shared `[learner]`/`[critic]` and each method's table."""

    learner: dict[str, Any] = field(default_factory=dict)
    critic: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, MethodTable] = field(default_factory=dict)

    def learner_for(self, method: str) -> dict[str, Any]:
        return merge(self.learner, self.tables[method].learner)

    def critic_for(self, method: str) -> dict[str, Any]:
        return merge(self.critic, self.tables[method].critic)


def load_agent_experiment(config: str | Path = "agent_experiment") -> AgentExperiment:
    """A preset name (configs/<name>.toml) or a path; every method's learner and critic are checked as
    the learner will load them. Raises ExperimentError naming the key."""
    s = check_sections(SECTIONS, read_toml(resolve_config(config)))
    exp: AgentSettings = s["experiment"]
    tables: dict[str, MethodTable] = s["methods"]
    cfg = AgentExperiment(**{f.name: getattr(exp, f.name) for f in dataclasses.fields(AgentSettings)},
                          learner=s["learner"], critic=s["critic"], tables=tables)
    cfg = with_overrides(cfg, methods=exp.methods or tuple(tables))
    for name in cfg.methods:
        load_section(LearnerConfig, cfg.learner_for(name), f"methods.{name}.learner")
        load_section(CriticConfig, cfg.critic_for(name), f"methods.{name}.critic")
    return cfg


def with_overrides(cfg: AgentExperiment, **kw: Any) -> AgentExperiment:
    """`cfg` with the given fields replaced (None: kept); raises ExperimentError for a method without a
    `[methods.NAME]` table."""
    out = dataclasses.replace(cfg, **{k: v for k, v in kw.items() if v is not None})
    unknown = [m for m in out.methods if m not in out.tables]
    if unknown:
        raise ExperimentError(f"--methods: unknown {unknown} (known: {', '.join(out.tables)})")
    return out
