"""Command-line entry points for simulated users and experiments, registered into `liveloop`'s parser:

    liveloop simulate --scenario drift [--base-url URL] [--api-key KEY] [--admin-key KEY] [--events N] [--out FILE]
    liveloop experiment drift [--config drift_experiment] [--out DIR] [--methods sao grpo ...]
    liveloop experiment stability [--config stability_experiment] [--out DIR] [--events N]
    liveloop experiment agent [--config agent_experiment] [--out DIR] [--methods sao ...] [--seeds N] [--episodes N]

Each handler takes the parsed `args` and returns an exit code. `--scenario` and `experiment --config`
(the experiment's own file, not the deployment config) take a preset name (configs/<name>.toml) or a
path to a TOML file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path


def cmd_simulate(args: argparse.Namespace) -> int:
    from liveloop.clients.scenario import load_scenario
    from liveloop.clients.simulator import Simulator, summarize, write_events
    from liveloop.config import ConfigError

    try:
        scenario = load_scenario(args.scenario)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.events:
        scenario = scenario.with_sizes(max_events=args.events)
    if args.group_size:
        scenario = scenario.with_sizes(group_size=args.group_size)
    try:
        sim = Simulator(scenario, args.base_url, args.api_key, admin_key=args.admin_key)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        events = asyncio.run(sim.run())
    except KeyboardInterrupt:
        events = sim.events
    if args.out:
        write_events(events, Path(args.out))
    print(json.dumps(summarize(events), indent=2))
    return 0


def _experiment_config(args: argparse.Namespace, only: list[str] | None = None):
    from liveloop.config import ConfigError
    from liveloop.experiments.drift import load_experiment

    try:
        return load_experiment(args.experiment_config, only=only)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def cmd_experiment_drift(args: argparse.Namespace) -> int:
    import time

    from liveloop.experiments.drift import run_drift, with_seed

    cfg = _experiment_config(args, only=args.methods or None)
    if cfg is None:
        return 2
    if args.seed is not None:
        cfg = with_seed(cfg, args.seed)
    t = time.monotonic()
    out = run_drift(cfg, Path(args.out), resume=Path(args.resume) if args.resume else None)
    print((out / "summary.md").read_text())
    print(f"results: {out} ({(time.monotonic() - t) / 60:.1f} min)")
    return 0


def cmd_experiment_stability(args: argparse.Namespace) -> int:
    import dataclasses

    from liveloop.experiments.stability import run_stability

    cfg = _experiment_config(args)
    if cfg is None:
        return 2
    if args.events:
        cfg = dataclasses.replace(cfg, scenario=cfg.scenario.with_sizes(max_events=args.events))
    out = run_stability(cfg, Path(args.out))
    print((out / "summary.md").read_text())
    print(f"results: {out}")
    return 0


def cmd_experiment_agent(args: argparse.Namespace) -> int:
    from liveloop.config import ConfigError
    from liveloop.experiments.agent_config import load_agent_experiment, with_overrides

    try:
        cfg = with_overrides(load_agent_experiment(args.experiment_config), methods=tuple(args.methods) if args.methods else None,
                             seeds=args.seeds, episodes=args.episodes, probe=args.probe)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from liveloop.experiments.agent import run_agent

    out = Path(args.out)
    run_agent(cfg, out, Path(args.model) if args.model else None)
    print((out / "report.md").read_text())
    print(f"results: {out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("simulate", help="simulated users against a running server (a scenario file)")
    sim.add_argument("--scenario", required=True, help="scenario: a preset name (drift = configs/scenarios/drift.toml) or a TOML path")
    sim.add_argument("--base-url", default="http://127.0.0.1:8000", help="the liveloop server (default: %(default)s)")
    sim.add_argument("--api-key", default="sk-dev-user-1", help="a user key of that server")
    sim.add_argument("--admin-key", default=None, help="an admin key of that server: the scenario's max_learner_lag reads the learner's position")
    sim.add_argument("--events", type=int, default=None, help="override scenario.max_events")
    sim.add_argument("--group-size", type=int, default=None, help="ask each prompt G times (GRPO learners)")
    sim.add_argument("--out", default=None, help="write every event as JSON lines here")
    sim.set_defaults(func=cmd_simulate)

    exp = subparsers.add_parser("experiment", help="experiments through the real system")
    kinds = exp.add_subparsers(dest="experiment", required=True)
    drift = kinds.add_parser("drift", help="preference drift: SAO against its baselines, one report")
    drift.add_argument(
        "--config", dest="experiment_config", default="drift_experiment",
        help="the experiment's TOML: a preset name or a path (default: %(default)s = configs/experiments/drift_experiment.toml)",
    )
    drift.add_argument("--out", default="results", help="parent of the results directory")
    drift.add_argument("--methods", nargs="+", default=None, help="run only these methods")
    drift.add_argument("--seed", type=int, default=None, help="run on this seed (scenario.seed and every learner.seed)")
    drift.add_argument("--resume", default=None, help="an interrupted run's results directory: keep its finished methods, run the rest")
    drift.set_defaults(func=cmd_experiment_drift)
    stab = kinds.add_parser("stability", help="long SAO run on a fixed preference: reward, kept fraction, critic grad norm")
    stab.add_argument(
        "--config", dest="experiment_config", default="stability_experiment",
        help="the experiment's TOML: a preset name or a path (default: %(default)s = configs/experiments/stability_experiment.toml)",
    )
    stab.add_argument("--out", default="results", help="parent of the results directory")
    stab.add_argument("--events", type=int, default=None, help="override scenario.max_events (e.g. 3000)")
    stab.set_defaults(func=cmd_experiment_stability)
    agent = kinds.add_parser("agent", help="an agent learns its tools from ratings of whole episodes: SAO against its ablations and baselines")
    agent.add_argument(
        "--config", dest="experiment_config", default="agent_experiment",
        help="the experiment's TOML: a preset name or a path (default: %(default)s = configs/experiments/agent_experiment.toml)",
    )
    agent.add_argument("--out", default="results/agent", help="results directory (default: %(default)s)")
    agent.add_argument("--methods", nargs="+", default=None, help="run only these (sao, sao_obs_actions, sao_last_turn, sliding_window, grpo)")
    agent.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the config's, 5)")
    agent.add_argument("--episodes", type=int, default=None, help="rated episodes per run (default: the config's, 768)")
    agent.add_argument("--probe", type=int, default=None, help="fixed tasks the accuracy is measured on (default: the config's, 96)")
    agent.add_argument("--model", default=None, help="the agent model (default: the config's experiment.model, built there when missing)")
    agent.set_defaults(func=cmd_experiment_agent)
