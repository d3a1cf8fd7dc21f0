"""The engine backends are listed once (server/engines/registry.py): the config's choices, the factory,
the CLI, the release gate and `liveloop config --backends` read that table."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from liveloop.config import ConfigError, load_config
from liveloop.server.config import EngineConfig
from liveloop.server.engines.registry import HELP, NAMES, ROWS, backend, engine_class, names_with, row

ROOT = Path(__file__).resolve().parents[4]


def test_each_backend_names_its_module_class_and_engine_name():
    """Read on the source (importing vllm is not free): the module defines the class, whose `name` is the
    backend's."""
    for b in ROWS:
        tree = ast.parse((ROOT / "server" / "engines" / f"{b.module.replace('.', '/')}.py").read_text())
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        assert b.cls in classes, b
        names = [
            stmt.value.value for stmt in classes[b.cls].body
            if isinstance(stmt, ast.Assign) and [t.id for t in stmt.targets if isinstance(t, ast.Name)] == ["name"]
        ]
        assert names == [b.name], b


def test_the_config_and_the_cli_take_the_registered_names():
    assert typing.get_args(typing.get_type_hints(EngineConfig)["backend"]) == NAMES
    assert EngineConfig.__dataclass_fields__["backend"].metadata["help"] == HELP
    for name in NAMES:
        assert load_config(text=f"[engine]\nbackend = '{name}'\n").engine.backend == name
    with pytest.raises(ConfigError, match=r"engine.backend: expected one of \['vllm', 'hf', 'diffusion', 'sglang'\]"):
        load_config(text="[engine]\nbackend = 'tgi'\n")
    from liveloop.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    assert next(a for a in serve._actions if a.dest == "engine").choices == list(NAMES)  # noqa: SLF001


def test_capabilities_and_unknown_names():
    assert names_with("release_gate") == ("vllm", "hf") and names_with("adapter_slots") == ("hf",)
    assert names_with("blocking_start") == ("vllm",)
    with pytest.raises(ValueError, match=r"unknown backend 'tgi' \(vllm, hf, diffusion, sglang\)"):
        backend("tgi")
    from liveloop.server.control.gate import GATED_BACKENDS, SLOT_BACKENDS

    assert (GATED_BACKENDS, SLOT_BACKENDS) == (names_with("release_gate"), names_with("adapter_slots"))


def test_the_hf_worker_picks_the_hf_row_and_no_other():
    assert row("hf", "process").cls == "HFProcessEngine" and row("hf", "thread").cls == "HFEngine"
    assert row("vllm", "process").cls == "VLLMEngine" and row("sglang", "thread").cls == "SGLangEngine"
    assert engine_class("hf", "process").__name__ == "HFProcessEngine"
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        row("tgi", "process")
