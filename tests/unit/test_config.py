from pathlib import Path

import pytest

from liveloop.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_loads_every_section():
    cfg = load_config(ROOT / "configs/serve/default.toml")
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert cfg.engine.backend == "vllm"
    assert cfg.store.url.startswith("sqlite:///")
    assert cfg.auth.dev_admin_keys == ("sk-dev-admin",)
    assert cfg.model.out_dir == cfg.engine.model


def test_missing_sections_take_defaults():
    cfg = load_config(text="[server]\nport = 9000\n")
    assert cfg.server.port == 9000 and cfg.engine.max_model_len == 512


@pytest.mark.parametrize(
    "text, message",
    [
        ("[server]\nprot = 1\n", "server.prot: unknown key"),
        ("[store]\nbatch_max = 'x'\n", "store.batch_max: expected int, got str"),
        ("[server]\nport = true\n", "server.port: expected int, got bool"),
        ("[engine]\nmax_model_len = 1.5\n", "engine.max_model_len: expected int"),
        ("[auth]\ndev_user_keys = 'k'\n", "auth.dev_user_keys: expected a list"),
        ("[auth]\ndev_user_keys = [1]\n", "auth.dev_user_keys[0]: expected str"),
        ("[bogus]\nx = 1\n", "bogus: unknown section"),
        ("[engine]\nbackend = 'tgi'\n", "engine.backend: expected one of ['vllm', 'hf', 'diffusion', 'sglang'], got 'tgi'"),
        ("[server]\nport = 70000\n", "server: port must be"),
        ("[server]\nlimits_sync_seconds = 0\n", "server: limits_sync_seconds must be in"),
        ("[server]\nlimits_sync_seconds = 30\n", "server: limits_sync_seconds must be in"),
        ("[server]\nfleet_limits = 'yes'\n", "server.fleet_limits: expected bool, got str"),
        ("[server]\nmax_concurrent_per_key_fleet = -1\n", "server: max_concurrent_per_key_fleet must be >= 0"),
        ("[server]\nfleet_limits = false\nmax_concurrent_per_key_fleet = 4\n", "server: max_concurrent_per_key_fleet needs fleet_limits = true"),
        ("[segments]\nadapters = 'lanes'\n", "segments.adapters: expected one of ['none', 'segment', 'shared'], got 'lanes'"),
        ("[segments]\nnames = ['a', 'a']\n", "segments: names must be distinct and may not be 'overflow', 'shared' or 'base'"),
        ("[segments]\nnames = ['overflow']\n", "segments: names must be distinct"),
        ("[segments]\nnames = ['a:b']\n", "segments: names must be 1-64 characters without ':'"),
        ("[segments]\nnames = 'a'\n", "segments.names: expected a list"),
        ("[segments]\nadapters = 'shared'\n[learner]\nzero_stage = 1\n", "segments.adapters = 'shared' needs learner.zero_stage 0"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_bad_config_names_the_key(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(text=text)


def test_float_field_accepts_int():
    cfg = load_config(text="[engine]\ngpu_memory_utilization = 1\n")
    assert cfg.engine.gpu_memory_utilization == 1.0 and isinstance(cfg.engine.gpu_memory_utilization, float)


# deployment configs; job configs (bgpo.toml, drift.toml, ...) are loaded by their own jobs' tests
SERVER_CONFIGS = ("default.toml", "production.toml")


@pytest.mark.parametrize("path", [ROOT / "configs/serve" / name for name in SERVER_CONFIGS], ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.server.host == "127.0.0.1"  # nothing listens beyond loopback by default


# -- presets, `extends`, typed documents ------------------------------------------------------------

from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Literal  # noqa: E402

from liveloop.config import (  # noqa: E402
    CONFIG_DIR, check_literals, check_sections, load_section, merge, preset_kinds, presets, read_toml, resolve_config,
)


def test_config_dir_is_the_repository_configs_folder():
    assert CONFIG_DIR == ROOT / "configs"
    assert {"default", "production", "bgpo", "drift", "drift_experiment", "stability_experiment", "tuned_learner"} <= set(presets())


def test_presets_are_grouped_by_kind_each_name_once():
    kinds = preset_kinds()
    assert set(kinds) == {"serve", "experiments", "scenarios", "jobs", "suites", "fragments"}
    assert {"default", "production", "ray", "segment_adapters", "live_swaps", "tiny", "agents"} == set(kinds["serve"])
    assert {"tuned_learner", "step_control", "adapter_learning", "feedback_delay"} == set(kinds["fragments"])
    names = [name for names in kinds.values() for name in names]
    assert sorted(names) == presets() and len(set(names)) == len(names)  # a name is one preset, whatever its folder
    assert not list(CONFIG_DIR.glob("*.toml"))  # nothing loose beside the kinds' folders


def test_shared_fragments_are_referred_to_not_copied():
    """`[scenario.feedback_delay]` lives in fragments/feedback_delay.toml; the scenarios and experiments
    extend it (and read it as before)."""
    copies = [p.relative_to(CONFIG_DIR) for p in CONFIG_DIR.glob("*/*.toml") if "\n[scenario.feedback_delay]" in p.read_text()]
    assert copies == [Path("fragments/feedback_delay.toml")]
    shared = read_toml("feedback_delay")["scenario"]["feedback_delay"]
    for name in ("drift", "sycophancy", "drift_experiment", "stability_experiment", "drift_long", "stability_adapters"):
        assert read_toml(name)["scenario"]["feedback_delay"] == shared, name


def test_resolve_names_and_paths(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # a preset is found from any working directory
    assert resolve_config("default") == ROOT / "configs/serve/default.toml"
    assert resolve_config("tuned_learner") == ROOT / "configs/fragments/tuned_learner.toml"
    with caplog.at_level("WARNING", logger="liveloop.config"):  # where a preset lived before the kinds' folders
        assert resolve_config(ROOT / "configs/default.toml") == ROOT / "configs/serve/default.toml"
        assert load_config(ROOT / "configs/production.toml").store.url.startswith("postgresql")
    assert "pass its name, 'default'" in caplog.text
    assert resolve_config(ROOT / "configs/nothing.toml") == ROOT / "configs/nothing.toml"  # no such preset: the path
    assert resolve_config("x/y") == Path("x/y") and resolve_config("y.toml") == Path("y.toml")
    assert resolve_config(tmp_path / "z") == tmp_path / "z"  # a Path is always a path
    with pytest.raises(ConfigError, match=r"defualt: no preset of that name .*presets: .*default"):
        resolve_config("defualt")
    assert load_config("default").engine.backend == "vllm"
    with pytest.raises(ConfigError, match="cannot read config missing.toml"):
        load_config("missing.toml")


def test_merge_tables_deep_arrays_whole():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "arr": [{"n": 1}, {"n": 2}], "s": 1}
    over = {"a": {"y": {"q": 3}}, "arr": [{"n": 9}], "t": 2}
    assert merge(base, over) == {"a": {"x": 1, "y": {"p": 1, "q": 3}}, "arr": [{"n": 9}], "s": 1, "t": 2}
    assert base["a"]["y"] == {"p": 1, "q": 2}  # inputs untouched


def test_extends_a_preset_under_the_files_own_values(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('extends = "tuned_learner"\n[learner]\nkl_coef = 0.0\n[learner.sliding_window]\nwindow = 64\n')
    cfg = load_config(path)
    tuned = read_toml("tuned_learner")["learner"]
    assert cfg.learner.kl_coef == 0.0 and cfg.learner.sliding_window.window == 64  # the file's own values win
    assert cfg.learner.learning_rate == tuned["learning_rate"] and cfg.learner.lambda_alpha == tuned["lambda_alpha"]
    assert cfg.server.port == 8000  # sections neither file has take their defaults


def test_extends_chains_paths_relative_to_the_file_and_cycles(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/base.toml").write_text('extends = "default"\n[store]\nurl = "sqlite:///b.db"\n')
    (tmp_path / "top.toml").write_text('extends = "sub/base.toml"\n[server]\nport = 9001\n')
    cfg = load_config(tmp_path / "top.toml")
    assert (cfg.server.port, cfg.store.url, cfg.auth.dev_admin_keys) == (9001, "sqlite:///b.db", ("sk-dev-admin",))
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(tmp_path / "a.toml")
    with pytest.raises(ConfigError, match="extends: expected a preset name, a path or a list of them"):
        load_config(text="extends = 3\n")
    with pytest.raises(ConfigError, match="nope: no preset"):
        load_config(text='extends = "nope"\n')


def test_extends_a_list_merges_the_presets_in_order(tmp_path):
    (tmp_path / "a.toml").write_text("[learner]\nlearning_rate = 1e-3\nkl_coef = 0.2\n")
    (tmp_path / "b.toml").write_text("[learner]\nkl_coef = 0.3\nmax_step_kl = 0.05\n")
    (tmp_path / "top.toml").write_text('extends = ["a.toml", "b.toml"]\n[learner]\nmax_step_kl = 0.1\n')
    learner = load_config(tmp_path / "top.toml").learner
    assert (learner.learning_rate, learner.kl_coef, learner.max_step_kl) == (1e-3, 0.3, 0.1)  # b over a, the file over both
    with pytest.raises(ConfigError, match="a list of them"):
        load_config(text="extends = []\n")


@dataclass(frozen=True)
class _Item:
    name: str
    kind: Literal["a", "b"] = "a"
    tags: tuple[Literal["x", "y"], ...] = ()
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_literals(self)
        if self.weight <= 0:
            raise ValueError("weight must be > 0")


@dataclass(frozen=True)
class _Doc:
    title: str = "t"
    items: tuple[_Item, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def test_arrays_of_tables_load_as_tuples_of_dataclasses():
    data = read_toml(text='title = "d"\n[[items]]\nname = "one"\ntags = ["x"]\n[[items]]\nname = "two"\nkind = "b"\nweight = 2\n')
    doc = load_section(_Doc, data, "")
    assert doc.title == "d" and doc.items == (_Item("one", tags=("x",)), _Item("two", "b", (), 2.0))
    assert isinstance(doc.items[1].weight, float)
    loaded = check_sections({"items": tuple[_Item, ...], "doc": _Doc}, {"items": [{"name": "z"}]})
    assert loaded == {"items": (_Item("z"),), "doc": _Doc()}  # a missing section: its defaults (or no items)


@pytest.mark.parametrize(
    "items, message",
    [
        ([{"name": "a", "kind": "c"}], r"items\[0\]\.kind: expected one of \['a', 'b'\], got 'c'"),
        ([{"name": "a"}, {"name": "b", "tags": ["x", "z"]}], r"items\[1\]\.tags\[1\]: expected one of"),
        ([{"kind": "a"}], r"items\[0\]\.name: missing"),
        ([{"name": "a", "wieght": 1}], r"items\[0\]\.wieght: unknown key"),
        ([{"name": "a", "weight": 0}], r"items\[0\]: weight must be > 0"),
        ({"name": "a"}, r"items: expected a list, got dict"),
        (["a"], r"items\[0\]: expected a table, got str"),
    ],
)
def test_bad_array_of_tables_names_the_key(items, message):
    with pytest.raises(ConfigError, match=message):
        load_section(_Doc, {"items": items}, "")


def test_check_literals_applies_to_instances_built_in_code():
    with pytest.raises(ValueError, match="kind must be one of a, b, got 'c'"):
        _Item("n", kind="c")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tags\[0\] must be one of x, y, got 'q'"):
        _Item("n", tags=("q",))  # type: ignore[arg-type]


def test_every_preset_loads_with_its_loader():
    from liveloop.clients.scenario import load_scenario
    from liveloop.diffusion.config import load_bgpo_config
    from liveloop.experiments.agent_config import load_agent_experiment
    from liveloop.experiments.drift import load_experiment
    from liveloop.release.suite import load_suite

    loaders = {
        "default": load_config, "tiny": load_config, "agents": load_config, "production": load_config, "tuned_learner": load_config, "bgpo": load_bgpo_config,
        "drift": load_scenario, "drift_experiment": load_experiment, "stability_experiment": load_experiment, "step_control": load_config,
        "drift_long": load_experiment, "segment_adapters": load_config, "stability_adapters": load_experiment,
        "live_swaps": load_config, "ray": load_config, "adapter_learning": load_config, "evaluation_default": load_suite, "sycophancy": load_scenario,
        "agent_experiment": load_agent_experiment, "feedback_delay": read_toml,  # a scenario fragment: checked where extended
    }
    assert set(presets()) == set(loaders), "a new preset in configs/: add its loader here"
    for name, load in loaders.items():
        assert load(name) is not None, name


def test_config_sections_are_typed_with_their_classes():
    import typing

    import liveloop.config as module
    from liveloop.config import Config, _sections

    sections = _sections()
    hints = typing.get_type_hints(Config, {**vars(module), **{cls.__name__: cls for cls in sections.values()}})
    assert {name: hints[name] for name in sections} == sections


def test_server_watch_interval_is_its_own_setting():
    cfg = load_config(text="[server]\nwatch_seconds = 0.5\n[learner]\npoll_seconds = 0.05\n")
    assert cfg.server.watch_seconds == 0.5 and cfg.learner.poll_seconds == 0.05
    assert load_config(text="").server.watch_seconds == 0.1
    with pytest.raises(ConfigError, match="server: watch_seconds must be > 0"):
        load_config(text="[server]\nwatch_seconds = 0\n")


# -- weight: loading a config imports no torch -----------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402

_LOADERS = {  # the loader of every kind of preset (test_every_preset_loads_with_its_loader names them per preset)
    "liveloop.config:load_config": ("default", "tiny", "agents", "production", "tuned_learner", "step_control", "segment_adapters", "live_swaps", "ray", "adapter_learning"),
    "liveloop.diffusion.config:load_bgpo_config": ("bgpo",),
    "liveloop.clients.scenario:load_scenario": ("drift", "sycophancy"),
    "liveloop.experiments.drift:load_experiment": ("drift_experiment", "stability_experiment", "drift_long", "stability_adapters"),
    "liveloop.release.suite:load_suite": ("evaluation_default",),
    "liveloop.experiments.agent_config:load_agent_experiment": ("agent_experiment",),
    "liveloop.config:read_toml": ("feedback_delay",),  # a scenario fragment, type-checked in the presets that extend it
}

_NO_TORCH = """
import importlib, sys
loaders = {loaders!r}
for where, names in loaders.items():
    module, name = where.split(":")
    load = getattr(importlib.import_module(module), name)
    for preset in names:
        assert load(preset) is not None, preset
heavy = sorted(m for m in ("torch", "transformers", "vllm", "ray", "peft", "deepspeed") if m in sys.modules)
assert not heavy, heavy
"""


def test_loading_any_preset_imports_no_torch(tmp_path):
    """Every preset by name, with its loader, in a fresh interpreter (from another directory): no torch,
    no transformers, no engine. A CLI's --help and a config check must not pay for them."""
    assert {p for names in _LOADERS.values() for p in names} == set(presets()), "a new preset: add its loader here"
    code = _NO_TORCH.format(loaders=_LOADERS)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def test_cli_help_and_config_check_import_no_torch(tmp_path):
    code = """
import contextlib, io, sys
from liveloop.cli import main
for argv in (["--help"], ["serve", "--help"], ["model", "init", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    assert "usage: liveloop" in out.getvalue(), argv
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["config", "--config", "production"]) == 0
assert '"engine"' in out.getvalue()
assert "torch" not in sys.modules and "transformers" not in sys.modules
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


def test_config_dir_is_package_data_of_liveloop_configs():
    import importlib.resources

    assert CONFIG_DIR == Path(str(importlib.resources.files("liveloop.configs")))
    assert sorted(p.stem for p in CONFIG_DIR.glob("*/*.toml")) == presets()


# -- each component's knobs in its own section -----------------------------------------------------

def test_the_segment_key_is_the_servers(caplog):
    """The request metadata key that names a segment is read by the server alone: `[server] segment_key`
    (it was `[learner] segment_key`: an older file still loads, with a warning)."""
    from liveloop.learner.config import LearnerConfig
    from liveloop.segments import segment_of

    cfg = load_config(text="[server]\nsegment_key = 'team'\n[segments]\nadapters = 'segment'\nnames = ['a']\n")
    assert segment_of({"team": "a"}, cfg.segments, cfg.server.segment_key) == "a"
    assert segment_of({"segment": "a"}, cfg.segments, cfg.server.segment_key) == "overflow"
    assert load_config(text="").server.segment_key == "segment"
    with caplog.at_level("WARNING", logger="liveloop.config"):
        old = load_config(text="[learner]\nsegment_key = 'team'\n")
    assert old.server.segment_key == "team" and "learner.segment_key moved to server.segment_key" in caplog.text
    assert load_config(text="[learner]\nsegment_key = 'team'\n[server]\nsegment_key = 'team'\n").server.segment_key == "team"
    with pytest.raises(ConfigError, match="learner.segment_key: moved to server.segment_key, which <text> sets to another value"):
        load_config(text="[learner]\nsegment_key = 'team'\n[server]\nsegment_key = 'org'\n")
    with pytest.raises(ConfigError, match="learner.segment_key: unknown key"):  # the learner's own section has none
        load_section(LearnerConfig, {"segment_key": "team"}, "learner")


def test_the_segments_are_their_own_section():
    """Which adapters serve and train, and the segments with their own, are `[segments]`'s: the server
    routes by them and the learner trains by them (liveloop/segments.py)."""
    from liveloop.learner.config import LearnerConfig
    from liveloop.segments import SegmentsConfig, lanes, segment_of

    cfg = load_config(text="[segments]\nadapters = 'segment'\nnames = ['cozy', 'night']\n")
    assert cfg.segments == SegmentsConfig(adapters="segment", names=("cozy", "night"))
    assert lanes(cfg.segments) == ("cozy", "night", "overflow")
    assert segment_of({"segment": "night"}, cfg.segments) == "night" and segment_of({"segment": "day"}, cfg.segments) == "overflow"
    assert load_config(text="").segments == SegmentsConfig() and lanes(SegmentsConfig()) == ()
    assert lanes(load_config(text="[segments]\nadapters = 'shared'\n").segments) == ("shared",)
    assert load_config("segment_adapters").segments == cfg.segments
    for key in ("adapters", "segments"):  # the learner's own section has neither
        with pytest.raises(ConfigError, match=f"learner.{key}: unknown key"):
            load_section(LearnerConfig, {key: "segment" if key == "adapters" else ["a"]}, "learner")


def test_an_older_files_learner_segments_load_with_a_warning(caplog):
    """`[learner] adapters` and `[learner] segments` moved to `[segments]` (`adapters`, `names`): an older
    file loads the same, with a warning naming the new place; both places set differently is an error."""
    new = load_config(text="[segments]\nadapters = 'segment'\nnames = ['cozy', 'night']\n[learner]\nkl_coef = 0.1\n")
    with caplog.at_level("WARNING", logger="liveloop.config"):
        old = load_config(text="[learner]\nadapters = 'segment'\nsegments = ['cozy', 'night']\nkl_coef = 0.1\n")
    assert (old.segments, old.learner) == (new.segments, new.learner)
    assert "learner.adapters moved to segments.adapters" in caplog.text and "learner.segments moved to segments.names" in caplog.text
    same = "[learner]\nsegments = ['cozy']\n[segments]\nnames = ['cozy']\n"
    assert load_config(text=same).segments.names == ("cozy",)
    with pytest.raises(ConfigError, match="learner.segments: moved to segments.names, which <text> sets to another value"):
        load_config(text="[learner]\nsegments = ['cozy']\n[segments]\nnames = ['night']\n")
    with pytest.raises(ConfigError, match="learner.adapters: moved to segments.adapters, which <text> sets to another value"):
        load_config(text="[learner]\nadapters = 'shared'\n[segments]\nadapters = 'segment'\n")
    with pytest.raises(ConfigError, match="segments: names must be distinct"):  # a moved value is checked where it lands
        load_config(text="[learner]\nsegments = ['base']\n")


def test_the_fleet_membership_knobs_are_the_servers(caplog):
    """Every serving process is a replica of its fleet (a plain `liveloop serve` one of one), so its name,
    heartbeat and leader lease are `[server]`'s; an older file's `[ray]` keys still load, with a warning,
    and a disagreement between the two places is an error naming the new key."""
    import logging

    cfg = load_config(text="[server]\nreplica_id = 'east-1'\nheartbeat_seconds = 0.5\ndown_after_seconds = 2.0\nleader_lease_seconds = 3.0\n")
    assert (cfg.server.replica_id, cfg.server.heartbeat_seconds, cfg.server.down_after_seconds, cfg.server.leader_lease_seconds) == (
        "east-1", 0.5, 2.0, 3.0)
    assert not hasattr(cfg.ray, "replica_id")
    with caplog.at_level(logging.WARNING, logger="liveloop.config"):
        old = load_config(text="[ray]\nheartbeat_seconds = 0.5\ndown_after_seconds = 2.0\n")
    assert (old.server.heartbeat_seconds, old.server.down_after_seconds) == (0.5, 2.0)
    assert "ray.heartbeat_seconds moved to server.heartbeat_seconds" in caplog.text
    with pytest.raises(ConfigError, match="server.leader_lease_seconds"):
        load_config(text="[ray]\nleader_lease_seconds = 3.0\n[server]\nleader_lease_seconds = 4.0\n")
    with pytest.raises(ValueError, match="down_after_seconds"):
        load_config(text="[server]\nheartbeat_seconds = 2.0\ndown_after_seconds = 1.0\n")
