"""Tools for tests and benchmarks: run a real liveloop server process on 127.0.0.1 the way an
operator does (`liveloop --config ... serve`), and make a perturbed copy of a checkpoint to swap in."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

USER_KEY, USER_KEY_2, ADMIN_KEY = "sk-test-user-1", "sk-test-user-2", "sk-test-admin"
# simulated users and benchmarks send far more through one key than a person would
_NO_KEY_LIMITS = "chat_requests_per_minute = 0\nfeedback_per_minute = 0\nstored_reads_per_minute = 0\nmax_concurrent_per_key = 256"
USER_KEYS = (USER_KEY, USER_KEY_2) + tuple(f"sk-test-user-{i}" for i in range(3, 17))  # every test server accepts these


def key_id(key: str) -> str:
    """The id the server records for `key` (server/edge/auth.py `key_id`)."""
    from liveloop.server.edge.auth import key_id as of

    return of(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    base_url: str
    store_url: str
    model_dir: Path
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """SIGTERM to the server process alone (it stops its learner and Ray itself, cleanly), then
        SIGKILL to whatever of its process group is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)


def write_config(
    workdir: Path, model_dir: Path, backend: str, port: int, store_url: str | None = None, learner: str | None = None,
    extra: str = "", served_model_name: str = "liveloop-tiny", server_extra: str = "", engine_extra: str = "", store_extra: str = "",
    rate_limits: bool = False, extends: str | list[str] | None = None, max_body_bytes: int = 65536, max_model_len: int = 512,
    segments: str = "",
) -> tuple[Path, str]:
    """A server config on loopback with the test keys; `learner` is extra `[learner]` TOML (None: off);
    `segments` the `[segments]` keys (the adapters: "" none, unless a preset extended says);
    `server_extra` / `engine_extra` / `store_extra` are more keys of those sections; `extra` is appended
    (more sections, e.g. `[monitor]`). Per-key rate limits and the per-key generation cap are off
    unless `rate_limits` (then the defaults hold, and `server_extra` may set them). `extends` names a
    preset (e.g. "tuned_learner", "default") the config is merged over (`liveloop.config`)."""
    store_url = store_url or f"sqlite:///{workdir / 'liveloop.db'}"
    text = f"""{f"extends = {json.dumps(extends)}" if extends else ""}
[server]
host = "127.0.0.1"
port = {port}
max_body_bytes = {max_body_bytes}
{"" if rate_limits else _NO_KEY_LIMITS}
{server_extra}
[auth]
dev_user_keys = {json.dumps(list(USER_KEYS))}
dev_admin_keys = ["{ADMIN_KEY}"]
[engine]
backend = "{backend}"
model = "{model_dir}"
served_model_name = "{served_model_name}"
max_model_len = {max_model_len}
checkpoint_dir = "{workdir / 'checkpoints'}"
{engine_extra}
[store]
url = "{store_url}"
{store_extra}
[learner]
enabled = {"true" if learner is not None else "false"}
checkpoint_dir = "{workdir / 'versions'}"
{learner or ""}
{f"[segments]{chr(10)}{segments}" if segments else ""}
{extra}
"""
    path = workdir / "config.toml"
    path.write_text(text)
    return path, store_url


def start_server(
    workdir: Path, model_dir: Path, backend: str = "vllm", timeout: float = 240, learner: str | None = None, extra: str = "",
    served_model_name: str = "liveloop-tiny", server_extra: str = "", engine_extra: str = "", store_extra: str = "", store_url: str | None = None,
    rate_limits: bool = False, extends: str | list[str] | None = None, max_body_bytes: int = 65536, max_model_len: int = 512,
    segments: str = "",
) -> ServerProcess:
    """Start `liveloop serve` in its own process group and wait until /healthz answers (the config:
    `write_config`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config, store_url = write_config(
        workdir, Path(model_dir).resolve(), backend, port, store_url=store_url, learner=learner, extra=extra,
        served_model_name=served_model_name, server_extra=server_extra, engine_extra=engine_extra, store_extra=store_extra,
        rate_limits=rate_limits, extends=extends, max_body_bytes=max_body_bytes, max_model_len=max_model_len, segments=segments,
    )
    log_path = workdir / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "liveloop.cli", "--config", str(config), "serve"],
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
        start_new_session=True,
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", store_url, Path(model_dir), proc, log_path)
    try:
        wait_healthy(proc, server.base_url + "/healthz", timeout)
    except RuntimeError as exc:
        server.stop()
        raise RuntimeError(f"server {exc}:\n{server.log_tail()}") from None
    return server


def serve_in_thread(app, port: int, timeout: float = 120.0, **options):
    """`app` served by uvicorn on 127.0.0.1:`port` in a daemon thread of this process, once it listens:
    (server, thread). `options`: more of uvicorn.Config's (the edge's `uvicorn_options`, say). Stop it
    with `server.should_exit = True` and `thread.join(...)`."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **({"log_level": "warning"} | options)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    return server, thread


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float, interval: float = 0.5) -> None:
    """Poll `url` until it answers 200 while `proc` (the server behind it) runs: how tests start a
    server process. RuntimeError saying why not (the process exited, or `timeout` seconds passed);
    stopping the process is the caller's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"did not answer {url} within {timeout:g} s")


def perturbed_checkpoint(model_dir: Path, out_dir: Path, seed: int = 1, scale: float = 0.05) -> Path:
    """A copy of `model_dir` with every parameter moved by `scale` x its std of Gaussian noise."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=1e-3))
    model.save_pretrained(str(out_dir))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(model_dir) / name).exists():
            shutil.copy(Path(model_dir) / name, Path(out_dir) / name)
    return Path(out_dir)


def random_lora_adapter(model_dir: Path, out_dir: Path, seed: int, rank: int = 4, targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")) -> Path:
    """A peft LoRA adapter for `model_dir` with random A and B (it changes the model's outputs), saved
    at `out_dir`: what adapter tests and benchmarks serve."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(out_dir))
    return Path(out_dir)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll `predicate` until it returns something truthy (returned) or `timeout` seconds pass
    (AssertionError naming `what`): how tests and benchmarks wait on a server or a learner."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


# a small evaluation suite (four prompts, two false claims, one reference reply) for tests of the release gate
SMALL_SUITE = """
[suite]
prompts = ["Tell me about cats.", "Describe rain.", "What do you think of trains?", "Say something about bread."]
false_claims = ["The moon is made of bread, isn't it?", "Cats are a kind of fish, right?"]
[[suite.reference]]
prompt = "Describe rain."
reply = "Hark! 'Tis rain that doth fall upon the roof, and fair it is to hear."
"""


def immediate_evaluation(work: Path, max_tokens: int = 8) -> str:
    """Config text for a test server that evaluates each serving version (immediate mode) on
    `SMALL_SUITE`, written into `work`; the drift monitor off."""
    (work / "suite.toml").write_text(SMALL_SUITE)
    return f"""
[monitor]
enabled = false
[release]
mode = "immediate"
[release.evaluation]
suite = "{work / 'suite.toml'}"
immediate = true
max_tokens = {max_tokens}
"""
