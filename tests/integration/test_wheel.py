"""The installable package: the built wheel, installed into a fresh venv, works outside the checkout.

The wheel is built from a copy of the sources pyproject.toml names (so the build writes nothing into
the checkout), installed with `--no-deps` into a new venv in a temporary directory, and run from another
directory: `liveloop --help`, every preset by name with its loader (no torch imported), `liveloop
config`, `liveloop serve --help`. The dependencies are not installed again (torch alone takes minutes):
after the install, a .pth file in the fresh venv lists this venv's site-packages as a plain path line.
Only .pth files in a site directory are executed, so this venv's editable-install finder (its own .pth)
never runs there: `liveloop` is the wheel's, which the test checks (`liveloop.__file__`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

pytestmark = pytest.mark.slow

# every preset by its loader, in the installed package: no torch, no engine; then what `liveloop config
# --presets` lists
LOAD_PRESETS = """
import contextlib, importlib, io, sys
from liveloop.config import presets
loaders = {"bgpo": "liveloop.diffusion.config:load_bgpo_config", "drift": "liveloop.clients.scenario:load_scenario",
           "sycophancy": "liveloop.clients.scenario:load_scenario", "evaluation_default": "liveloop.release.suite:load_suite"}
experiments = ("drift_experiment", "stability_experiment", "drift_long", "stability_adapters")
loaders.update({name: "liveloop.experiments.drift:load_experiment" for name in experiments})
loaders["agent_experiment"] = "liveloop.experiments.agent_config:load_agent_experiment"
loaders["feedback_delay"] = "liveloop.config:read_toml"  # a scenario fragment
for name in presets():
    module, fn = loaders.get(name, "liveloop.config:load_config").split(":")
    assert getattr(importlib.import_module(module), fn)(name) is not None, name
assert "torch" not in sys.modules, "loading a preset imported torch"
from liveloop.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    assert main(["config", "--presets"]) == 0
print(out.getvalue())
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 180) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}: rc {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def _copy_sources(dest: Path) -> None:
    """pyproject.toml, README.md and every folder a package lives in (package-dir), without caches."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in sorted(set(PYPROJECT["package-dir"].values())):
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's python, its bin/, the package folder it installed, an environment, a work dir)."""
    tmp = tmp_path_factory.mktemp("wheel")
    _copy_sources(tmp / "src")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "LIVELOOP_HOME")}
    env.update(XDG_CACHE_HOME=str(tmp / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", str(tmp / "src"), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist")], tmp, env, 300)
    wheels = list((tmp / "dist").glob("liveloop-*.whl"))
    assert len(wheels) == 1, wheels
    _run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], tmp, env)
    python = tmp / "venv" / "bin" / "python"
    # the install sees only the fresh venv (this venv's liveloop is not visible to it, so nothing is
    # uninstalled here); the dependencies' path is added after
    _run([*pip, "--python", str(python), "install", "--no-deps", "-q", str(wheels[0])], tmp, env, 300)
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).strip())
    (purelib / "zz_liveloop_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp / "work"  # another directory: no checkout, no configs/, no models/
    work.mkdir()
    return python, python.parent, purelib / "liveloop", env, work


def test_the_installed_package_is_the_wheel_with_its_data(installed):
    python, _, package, env, work = installed
    where = _run([str(python), "-c", "import liveloop, liveloop.config as c; print(liveloop.__file__); print(c.CONFIG_DIR)"], work, env)
    module, config_dir = where.split()
    assert Path(module) == package / "__init__.py"  # the wheel's, not the checkout's (editable) package
    assert Path(config_dir) == package / "configs"
    def presets(root: Path) -> set[Path]:  # configs/<kind>/<name>.toml
        return {p.relative_to(root) for p in root.glob("*/*.toml")}

    assert presets(package / "configs") == presets(ROOT / "configs") and len(presets(ROOT / "configs")) > 10
    assert {p.name for p in (package / "server" / "edge" / "admin" / "static").iterdir()} == {p.name for p in (ROOT / "server" / "edge" / "admin" / "static").iterdir()}
    migrations = package / "store" / "migrations"
    assert (migrations / "script.py.mako").is_file() and (migrations / "env.py").is_file()
    assert {p.name for p in (migrations / "versions").glob("*.py")} == {p.name for p in (ROOT / "store/migrations/versions").glob("*.py")}


def test_cli_and_every_preset_work_from_another_directory(installed):
    python, bin_dir, package, env, work = installed
    liveloop = str(bin_dir / "liveloop")
    assert "usage: liveloop" in _run([liveloop, "--help"], work, env)
    assert "--no-learner" in _run([liveloop, "serve", "--help"], work, env)
    listed = json.loads(_run([str(python), "-c", LOAD_PRESETS], work, env))
    assert Path(listed["dir"]) == package / "configs"
    assert listed["presets"] == sorted(p.stem for p in (ROOT / "configs").glob("*/*.toml"))
    shown = json.loads(_run([liveloop, "--config", "default", "config"], work, env))  # a preset by name, anywhere
    assert Path(shown["config"]) == package / "configs" / "serve" / "default.toml"
    assert shown["sections"]["engine"]["model"] == "models/smollm2-135m-instruct"
    assert shown["sections"]["learner"]["kl_estimator"] == "exact"  # `extends = "step_control"`, from the package too
    # the default model outside a checkout: the user's cache, where `model init` imports it
    assert Path(shown["model"]) == Path(env["XDG_CACHE_HOME"]) / "liveloop" / "models" / "smollm2-135m-instruct"
    tiny = json.loads(_run([liveloop, "--config", "tiny", "config"], work, env))  # a preset extending the default, from the package
    assert Path(tiny["model"]) == Path(env["XDG_CACHE_HOME"]) / "liveloop" / "models" / "liveloop-tiny"
    assert not any(work.iterdir())  # nothing written into the working directory
