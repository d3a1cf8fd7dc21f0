"""A learner that starts removes the staging directories a crashed learner process left behind (its pid
is gone), and never those of a live process or its own."""

from __future__ import annotations

import os
import subprocess
import sys

from liveloop.checkpoint import sweep_stale_staging


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_stale_staging_is_swept(tmp_path):
    dead, live, own = _dead_pid(), os.getppid(), os.getpid()
    names = [f".staging-{dead}-sao", f"..staging-{dead}-sao.tmp-{dead}", f".staging-{live}-sao", f".staging-{own}-sao-cozy",
             "v000003", ".v000004.tmp-1"]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "policy").write_text("x")
    removed = sweep_stale_staging(tmp_path)
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    assert sweep_stale_staging(tmp_path / "missing") == []
