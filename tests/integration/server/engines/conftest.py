"""The SGLang stand-in (tests/standins/sglang_server.py) as a real HTTP server process on a free
127.0.0.1 port, serving the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from liveloop.devtools import free_port, wait_healthy

STANDIN = Path(__file__).resolve().parents[4] / "tests" / "standins" / "sglang_server.py"


@dataclass
class StandIn:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_standin(model_dir: Path, *, radix_cache: bool = False, api_key: str | None = None, deadline: float = 120.0) -> StandIn:
    port = free_port()
    args = [sys.executable, str(STANDIN), "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if not radix_cache:
        args.append("--disable-radix-cache")
    if api_key:
        args += ["--api-key", api_key]
    process = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"})
    standin = StandIn(f"http://127.0.0.1:{port}", process)
    try:
        wait_healthy(process, standin.url + "/health", deadline, interval=0.2)
    except RuntimeError as exc:
        standin.stop()
        raise RuntimeError(f"the SGLang stand-in {exc}") from None
    return standin


@pytest.fixture(scope="session")
def sglang_standin(model_dir):
    """A stand-in SGLang server the tests share (radix cache off, as liveloop's keep swaps need): an
    engine's start makes it serve the engine's model again; a test that slows it down resets that."""
    standin = start_standin(model_dir)
    yield standin
    standin.stop()


@pytest.fixture
def own_sglang_standin(request, model_dir):
    """A stand-in SGLang server of the test's own (one it may stop), radix cache off unless parametrized
    indirectly with {"radix_cache": True} (or {"api_key": KEY}: it answers only callers with that key)."""
    standin = start_standin(model_dir, **getattr(request, "param", {}))
    yield standin
    standin.stop()
