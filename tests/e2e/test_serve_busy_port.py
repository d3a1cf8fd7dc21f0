"""A second `liveloop serve` on the port a running server listens on stops before it does anything: it
binds first, so it never creates or migrates its store, loads a model, sweeps shared memory or starts a
learner, and says why (exit 2). Both servers are real processes; the first keeps serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from liveloop.devtools import free_port, write_config

from .conftest import start_server, stop_server


def test_a_second_server_on_a_busy_port_exits_before_touching_its_store(tmp_path, model_dir):
    first = start_server(tmp_path / "first", model_dir, "hf")
    try:
        port = urlsplit(first.base_url).port
        work = tmp_path / "second"
        work.mkdir()
        path, _ = write_config(work, Path(model_dir).resolve(), "hf", free_port(), learner="")  # a learner, on a fresh store
        done = subprocess.run(
            [sys.executable, "-m", "liveloop.cli", "serve", "--config", str(path), "--port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=work,
        )
        assert done.returncode == 2, done.stderr
        assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
        assert not (work / "liveloop.db").exists()  # never created, never migrated
        assert sorted(p.name for p in work.iterdir()) == [path.name]  # no checkpoints, no learner state, nothing
        assert httpx.get(first.base_url + "/healthz", timeout=10, trust_env=False).status_code == 200
    finally:
        stop_server(first)
