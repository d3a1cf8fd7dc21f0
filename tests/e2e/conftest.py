"""A real liveloop server process (uvicorn + the real engine + SQLite) on 127.0.0.1, started the way
an operator starts it (`liveloop --config ... serve`), and helpers to read what it logged."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from liveloop.store import Store, StoreConfig

ROOT = Path(__file__).resolve().parents[2]
USER_KEY, USER_KEY_2, ADMIN_KEY = "sk-test-user-1", "sk-test-user-2", "sk-test-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    base_url: str
    store_url: str
    model_dir: Path
    proc: subprocess.Popen
    log_path: Path

    def store(self) -> Store:
        return Store(StoreConfig(url=self.store_url))

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def write_config(tmp: Path, model_dir: Path, backend: str, port: int, extra: str = "") -> tuple[Path, str]:
    store_url = f"sqlite:///{tmp / 'liveloop.db'}"
    text = f"""
[server]
host = "127.0.0.1"
port = {port}
max_body_bytes = 65536
[auth]
dev_user_keys = ["{USER_KEY}", "{USER_KEY_2}"]
dev_admin_keys = ["{ADMIN_KEY}"]
[engine]
backend = "{backend}"
model = "{model_dir}"
max_model_len = 512
checkpoint_dir = "{tmp / 'checkpoints'}"
[store]
url = "{store_url}"
{extra}
"""
    path = tmp / "config.toml"
    path.write_text(text)
    return path, store_url


def start_server(tmp: Path, model_dir: Path, backend: str, timeout: float = 240) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config, store_url = write_config(tmp, model_dir, backend, port)
    log_path = tmp / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), "serve"],
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        cwd=tmp,
        env=env,
        start_new_session=True,
    )
    server = Server(f"http://127.0.0.1:{port}", store_url, model_dir, proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.base_url + "/healthz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    pytest.fail(f"server did not become healthy in {timeout}s:\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, model_dir) -> Server:
    server = start_server(tmp_path_factory.mktemp("vllm-server"), model_dir, "vllm")
    yield server
    stop_server(server)


class Reference:
    """A transformers forward pass over the same weights: the logprobs a version should have logged."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(self, prompt_ids, response_ids) -> torch.Tensor:
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        logits = self.model(input_ids=ids).logits[0].float()
        n = len(prompt_ids)
        lp = torch.log_softmax(logits[n - 1 : -1], dim=-1)
        return lp.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0]
