"""The SGLang stand-in (tests/standins/sglang_server.py) as a real HTTP server process on a free
127.0.0.1 port, serving the tiny model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from liveloop.devtools import free_port

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


def start_standin(model_dir: Path, *, radix_cache: bool = False, deadline: float = 120.0) -> StandIn:
    port = free_port()
    args = [sys.executable, str(STANDIN), "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if not radix_cache:
        args.append("--disable-radix-cache")
    process = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"})
    standin = StandIn(f"http://127.0.0.1:{port}", process)
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        if process.poll() is not None:
            raise RuntimeError(f"the SGLang stand-in exited with {process.returncode}")
        try:
            if httpx.get(standin.url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                return standin
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    standin.stop()
    raise RuntimeError(f"the SGLang stand-in did not answer /health within {deadline:g} s")


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
    indirectly with {"radix_cache": True}."""
    standin = start_standin(model_dir, **getattr(request, "param", {}))
    yield standin
    standin.stop()
