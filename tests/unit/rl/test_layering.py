"""Layering of the RL core: the critic imports nothing from the learner (the learner builds on the
critic, not the other way round), `rl/` imports nothing from the learner, the critic, diffusion or the
server, and the learner does not import the demo corpus (the wiring passes prompts and rewards in).
Modules are imported in a fresh interpreter and `sys.modules` is read back."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest

import liveloop.critic
import liveloop.learner
import liveloop.rl

PROBE = "import importlib, json, sys; [importlib.import_module(m) for m in sys.argv[1:]]; print(json.dumps(sorted(sys.modules)))"


def _modules(package) -> list[str]:
    return [f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]


def _imported(*modules: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [m for m in json.loads(out.stdout.splitlines()[-1]) if m.startswith("liveloop.")]


def _under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def test_the_packages_have_the_modules_this_test_walks():
    assert {"liveloop.rl.advantages", "liveloop.rl.losses", "liveloop.rl.batch", "liveloop.rl.optim"} <= set(_modules(liveloop.rl))
    assert {"liveloop.critic.trainer", "liveloop.critic.pretrain"} <= set(_modules(liveloop.critic))


@pytest.mark.parametrize("module", _modules(liveloop.critic))
def test_the_critic_imports_nothing_from_the_learner(module):
    imported = _imported(module)
    assert module in imported
    assert _under(imported, "liveloop.learner") == []


@pytest.mark.parametrize("module", _modules(liveloop.rl))
def test_the_rl_core_imports_no_component(module):
    imported = _imported(module)
    assert module in imported
    assert _under(imported, "liveloop.learner", "liveloop.critic", "liveloop.diffusion", "liveloop.server") == []


def test_the_learner_does_not_import_the_demo_corpus():
    modules = _modules(liveloop.learner)
    imported = _imported(*modules)
    assert set(modules) <= set(imported)
    assert _under(imported, "liveloop.model", "liveloop.clients") == []
