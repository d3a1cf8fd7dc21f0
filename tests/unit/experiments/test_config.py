"""The drift experiment's config: the presets load (the tuned learner preset merged in), methods
resolve to valid [learner]/[critic] sections, bad files name the key; the CLI registers its commands."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from liveloop.config import ConfigError, read_toml
from liveloop.experiments.cli import register
from liveloop.experiments.drift import ExperimentError, load_experiment, toml_table
from liveloop.experiments.stability import load_stability

ROOT = Path(__file__).resolve().parents[3]
PRESET_TEXT = (ROOT / "configs/experiments/drift_experiment.toml").read_text()


def test_default_preset_has_every_method():
    cfg = load_experiment()
    by = {m.name: m for m in cfg.methods}
    assert list(by) == ["sao", "sao_k1", "sao_unfrozen", "sao_no_kl", "sliding_window", "grpo", "grpo_dis"]
    assert by["sao"].learner["kl_coef"] == 0.1 and by["sao_no_kl"].learner["kl_coef"] == 0.0
    assert by["sao_k1"].critic["value_steps"] == 1 and by["sao_unfrozen"].critic["freeze_attention"] is False
    assert by["sliding_window"].learner["sliding_window"]["window"] == 256 and not by["sliding_window"].uses_critic
    assert by["grpo"].grouped and by["grpo_dis"].grouped and by["sao"].uses_critic
    assert cfg.scenario_for(by["grpo"]).group_size == cfg.group_size and cfg.scenario_for(by["sao"]).group_size == 1
    assert len(cfg.digest) == 8


def test_learner_comes_from_the_tuned_preset_by_name():
    tuned = read_toml("tuned_learner")["learner"] | read_toml("step_control")["learner"]
    assert 'extends = ["tuned_learner", "step_control", "feedback_delay"]' in PRESET_TEXT  # referred to, not copied
    assert "learning_rate" not in PRESET_TEXT and "\n[scenario.feedback_delay]" not in PRESET_TEXT
    for cfg in (load_experiment("drift_experiment"), load_experiment(ROOT / "configs/experiments/drift_experiment.toml"), load_stability()):
        sao = cfg.methods[0]
        assert {k: sao.learner[k] for k in tuned} == tuned
    assert load_experiment().digest == load_experiment(ROOT / "configs/experiments/drift_experiment.toml").digest
    assert load_experiment().resolved["learner"] == {**tuned, "sliding_window": {"window": 256}}


def test_only_some_methods_and_bad_configs(tmp_path):
    assert [m.name for m in load_experiment(only=["grpo", "sao"]).methods] == ["grpo", "sao"]
    with pytest.raises(ExperimentError, match="--methods: unknown"):
        load_experiment(only=["ppo"])
    cases = {
        "[experiment]\nmethodz = []\n": r"experiment\.methodz: unknown key",
        "[experiment]\nbackend = 'tgi'\n": r"experiment\.backend: expected one of \['vllm', 'hf'\]",
        "[experiment]\ngroup_size = '4'\n": r"experiment\.group_size: expected int, got str",
        "[methods.sao]\npolicy = {}\n": r"methods\.sao\.policy: unknown key",
        PRESET_TEXT.replace('learner = { method = "grpo" }', 'learner = { method = "ppo" }'): r"methods\.grpo\.learner",
        PRESET_TEXT.replace("value_steps = 1", "value_step = 1"): r"methods\.sao_k1\.critic\.value_step: unknown key",
        PRESET_TEXT.replace("rating_probability = 0.9", "rating_probability = 2.0"): r"scenario: rating_probability must be in \(0, 1\]",
        PRESET_TEXT.replace('topics = ["cats"', 'topics = ["dogs"'): r"segments\[0\]\.topics\[0\]: expected one of",
        PRESET_TEXT.replace('"sao", "sao_k1"', '"sao", "nope"'): r"experiment\.methods: 'nope' has no \[methods\.nope\]",
    }
    for text, message in cases.items():
        path = tmp_path / "x.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_experiment(path)


def test_stability_default_has_no_switches():
    cfg = load_stability()
    assert [m.name for m in cfg.methods] == ["sao"]
    assert all(not s.switch_at for s in cfg.scenario.segments)


def test_toml_table():
    assert toml_table({"a": 1, "b": 0.5, "c": True, "d": "x"}) == 'a = 1\nb = 0.5\nc = true\nd = "x"'
    assert tomllib.loads(toml_table({"method": "grpo", "kl_coef": 0.0})) == {"method": "grpo", "kl_coef": 0.0}
    segments = {"adapters": "segment", "names": ["cozy", "night"]}
    assert tomllib.loads(toml_table(segments)) == segments
    with pytest.raises(ExperimentError, match="lists of str"):
        toml_table({"bad": [True]})


def test_cli_registers_simulate_and_experiments():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/default.toml")
    register(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["simulate", "--scenario", "configs/drift.toml", "--base-url", "http://h:1", "--api-key", "k"])
    assert (a.scenario, a.base_url, a.api_key, a.config) == ("configs/drift.toml", "http://h:1", "k", "configs/default.toml")
    assert callable(a.func)
    a = parser.parse_args(["--config", "g.toml", "experiment", "drift", "--config", "e.toml", "--out", "o", "--methods", "sao", "grpo"])
    assert (a.config, a.experiment_config, a.out, a.methods) == ("g.toml", "e.toml", "o", ["sao", "grpo"])
    a = parser.parse_args(["experiment", "stability", "--events", "3000"])
    assert a.events == 3000 and a.experiment_config == "stability_experiment" and callable(a.func)
    a = parser.parse_args(["experiment", "drift"])
    assert a.experiment_config == "drift_experiment"


def test_simulate_with_a_bad_scenario_exits_2(tmp_path, capsys):
    bad = tmp_path / "s.toml"
    bad.write_text("[scenario]\nmax_events = 0\n[[segments]]\nname = 'a'\ntopics = ['cats']\nstyles = ['cute']\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["simulate", "--scenario", str(bad)])
    assert args.func(args) == 2
    assert "scenario: max_events, arrival_rate and max_in_flight must be > 0" in capsys.readouterr().err


def test_experiment_with_a_bad_config_exits_2(tmp_path, capsys):
    bad = tmp_path / "e.toml"
    bad.write_text("[experiment]\nmethodz = []\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    for kind in ("drift", "stability"):
        args = parser.parse_args(["experiment", kind, "--config", str(bad)])
        assert args.func(args) == 2
        assert "experiment.methodz: unknown key" in capsys.readouterr().err


def test_a_resumed_run_keeps_finished_methods_and_refuses_another_config(tmp_path):
    from liveloop.clients.simulator import Event
    from liveloop.experiments.drift import MethodRun, load_run, resumed_dir, save_run, write_config

    cfg = load_experiment("drift_long")
    write_config(tmp_path, cfg)
    assert resumed_dir(tmp_path, cfg) == tmp_path
    event = Event(0, 1, "g", "cozy", "cats", "Tell me about cats.", 0, "cute", "cute", 1, "ok", True, 4, 0.1, 0.5, 0.3)
    run = MethodRun("sao", [event], {"step": 3}, [{"version": 1}], 12.5, 400.0)
    assert load_run(tmp_path, "sao") is None  # not run yet
    save_run(tmp_path, run)
    again = load_run(tmp_path, "sao")
    assert again.events == [event]
    assert (again.learner, again.versions, again.start_seconds, again.sim_seconds, again.error) == ({"step": 3}, [{"version": 1}], 12.5, 400.0, None)
    assert load_run(tmp_path, "grpo") is None
    with pytest.raises(ExperimentError, match="another config"):
        resumed_dir(tmp_path, load_experiment("drift_experiment"))
    with pytest.raises(ExperimentError, match="not an experiment"):
        resumed_dir(tmp_path / "nowhere", cfg)


def test_adapter_methods_need_the_hf_engine(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('extends = "drift_experiment"\n[experiment]\nmethods = ["a"]\n[methods.a]\nsegments = { adapters = "segment", names = ["cozy"] }\n')
    with pytest.raises(ExperimentError, match="backend"):
        load_experiment(path)


def test_a_methods_segments_are_its_servers(tmp_path, caplog):
    """A method's `segments` table is its server's `[segments]`; an older file's method `learner` with
    `adapters` and `segments` loads the same, with a warning; both set differently is an error."""
    head = 'extends = "drift_experiment"\n[experiment]\nmethods = ["a"]\nbackend = "hf"\n[methods.a]\n'
    new, old, both = tmp_path / "new.toml", tmp_path / "old.toml", tmp_path / "both.toml"
    new.write_text(head + 'segments = { adapters = "segment", names = ["cozy"] }\n')
    old.write_text(head + 'learner = { adapters = "segment", segments = ["cozy"] }\n')
    both.write_text(head + 'learner = { segments = ["night"] }\nsegments = { adapters = "segment", names = ["cozy"] }\n')
    (a,) = load_experiment(new).methods
    with caplog.at_level("WARNING", logger="liveloop.config"):
        (b,) = load_experiment(old).methods
    assert a.uses_adapters and dict(a.segments) == dict(b.segments) == {"adapters": "segment", "names": ["cozy"]}
    assert a.learner == b.learner and "methods.a: learner.segments moved to segments.names" in caplog.text
    with pytest.raises(ConfigError, match="learner.segments: moved to segments.names, which methods.a sets to another value"):
        load_experiment(both)


def test_another_seed_is_another_config():
    from liveloop.experiments.drift import with_seed

    cfg = load_experiment("drift_long")
    other = with_seed(cfg, 7)
    assert other.scenario.seed == 7 and all(m.learner["seed"] == 7 for m in other.methods)
    assert other.digest != cfg.digest and with_seed(cfg, 7).digest == other.digest
    assert cfg.scenario.seed == 0  # the loaded config is not changed
