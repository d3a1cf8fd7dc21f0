"""liveloop/temp_dirs.py: every kind of temporary directory a killed process leaves is swept by the next."""

import os
import signal
import subprocess
import sys

import pytest

from liveloop import temp_dirs

KINDS = ("verified", "ray", "staging", "ranks")  # every kind liveloop makes (the module's docstring)


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_processs_directory_is_swept_by_the_next_of_its_kind(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # a real process makes its directory the way liveloop does, then is killed before it can remove it
    child = subprocess.Popen(
        [sys.executable, "-c", f"from liveloop import temp_dirs; print(temp_dirs.owned_temp_dir({kind!r}), flush=True); "
         "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    left = child.stdout.readline().strip()
    assert os.path.isdir(left) and os.path.basename(left).startswith(temp_dirs.prefix(kind, child.pid))
    assert temp_dirs.sweep(kind, tmp_path) == []  # its process is alive: kept
    child.send_signal(signal.SIGKILL)
    child.wait()
    other = tmp_path / f"{temp_dirs.prefix('elsewhere', child.pid)}x"  # another kind: not this sweep's
    other.mkdir()
    mine = tmp_path / f"{temp_dirs.prefix(kind)}y"  # this process's own: never swept
    mine.mkdir()
    assert [str(p) for p in temp_dirs.sweep(kind, tmp_path)] == [left]
    assert not os.path.exists(left) and other.exists() and mine.exists()


def test_the_first_directory_of_a_kind_a_process_makes_sweeps_that_kind(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(temp_dirs, "_swept", set())
    dead = tmp_path / f"{temp_dirs.prefix('ray', 999_999_999)}z"  # no such pid
    dead.mkdir()
    made = temp_dirs.owned_temp_dir("ray")
    assert not dead.exists() and made.parent == tmp_path and oct(made.stat().st_mode & 0o777) == "0o700"
