"""A real liveloop server process (uvicorn + the real engine + SQLite) on 127.0.0.1, started the way
an operator starts it (`liveloop --config ... serve`), helpers to read what it logged, and raw clients
that vanish mid-request."""

from __future__ import annotations

import json
import re
import socket
import struct
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np

import pytest
import torch

from liveloop import devtools
from liveloop.devtools import ADMIN_KEY, USER_KEY, USER_KEY_2, ServerProcess  # noqa: F401 (re-exported)
from liveloop.sampling import Sampling, draw_logits
from liveloop.store import Store, StoreConfig

ROOT = Path(__file__).resolve().parents[2]


def start_server(tmp: Path, model_dir: Path, backend: str, learner: str | None = None, extra: str = "", **kw) -> ServerProcess:
    try:
        return devtools.start_server(tmp, model_dir, backend, learner=learner, extra=extra, **kw)
    except RuntimeError as exc:
        pytest.fail(str(exc))


AGENTS_MODEL, AGENTS_CONTEXT = "liveloop-tiny-agents", 131072  # configs/serve/agents.toml's


def start_agents_server(tmp: Path, model_dir: Path, learner: str | None = None) -> ServerProcess:
    """`liveloop serve` on the agents preset, its model extended from the session's tiny build into `tmp`
    (agent CLIs' bodies run to 90 KB: the body bound is 1 MiB, the preset's default)."""
    from liveloop.model.long_context import extend_context

    model = extend_context(model_dir, tmp / AGENTS_MODEL, AGENTS_CONTEXT)
    return start_server(tmp, model, "vllm", learner=learner, extends="agents", served_model_name=AGENTS_MODEL,
                        max_model_len=AGENTS_CONTEXT, max_body_bytes=1 << 20, extra="[monitor]\nenabled = false\n", timeout=300)


def stop_server(server: ServerProcess) -> None:
    server.stop()


def learner_worker(server: ServerProcess):
    """The co-located learner's Ray worker process under `server` (psutil.Process; None: not running)."""
    import psutil

    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "LearnerActor" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


def open_store(server: ServerProcess) -> Store:
    return Store(StoreConfig(url=server.store_url))


# a learner that publishes after every step, and the shared-memory transport it swaps through (the
# weight-path tests: authenticated weights, /dev/shm pre-emption), with the prompt they rate
FAST_LEARNER = """
publish_every_steps = 1
publish_every_seconds = 0.5
poll_seconds = 0.1
lambda_alpha = 1.0
kl_coef = 0.0
"""
SHM_TRANSPORT = '[transport]\nbackend = "shared_memory"'
MOON = [{"role": "user", "content": "Tell me about the moon."}]

CANARY_FRACTION = 0.3
# canary mode for the release tests: a candidate is judged after 4 ratings of its own, on a short evaluation
# whose only bound (KL to the live version) every perturbed checkpoint passes. One app key (USER_KEY) fronts
# the tests' people, sent as `user=`: routed by user under that key, and one key's vote is all there is
CANARY_RELEASE = f"""
[release]
mode = "canary"
canary_by = "user"
min_keys = 1
canary_fraction = {CANARY_FRACTION}
min_ratings = 4
[release.evaluation]
max_tokens = 8
[[release.evaluation.bounds]]
check = "kl_to_live"
max_rise = 100.0
"""


def publish_version(store: Store, parent: int, checkpoint: Path) -> int:
    """Publish `checkpoint` into the store the way a learner in another process does (`liveloop learn`)."""
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, model_dir) -> ServerProcess:
    server = start_server(tmp_path_factory.mktemp("vllm-server"), model_dir, "vllm")
    yield server
    stop_server(server)


class Reference:
    """A transformers forward pass over the same weights: the logprobs a version should have logged."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(self, prompt_ids, response_ids, sampling: Sampling | None = None) -> torch.Tensor:
        """Each response token's logprob, under the distribution `sampling`'s draw shaped (None: raw)."""
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        logits = self.model(input_ids=ids).logits[0].float()
        n = len(prompt_ids)
        tokens = torch.tensor(list(response_ids))
        shaped = logits[n - 1 : -1] if sampling is None else draw_logits(logits[n - 1 : -1], sampling, keep=tokens)
        return torch.log_softmax(shaped, dim=-1).gather(1, tokens[:, None])[:, 0]

    def check_shaped_draw(self, row) -> None:
        """A stored response drawn at temperature 2 and top_p 0.5: its record says so, its behaviour
        logprobs are the shaped distribution's (not the raw one's), and the learner's score of the same
        weights through the same shaping (`policy_log_dists`) is those logprobs: ratio 1 on-policy."""
        from liveloop.rl.batch import Sample, make_batch, policy_log_dists, scorable, token_logprobs

        assert row.sampling == Sampling(temperature=2.0, top_p=0.5)
        shaped = self.logprobs(row.prompt_ids.tolist(), row.response_ids.tolist(), row.sampling).numpy()
        raw = self.logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
        assert np.abs(row.behavior_logprobs - shaped).max() < 1e-3
        assert np.abs(row.behavior_logprobs - raw).max() > 0.05, "the raw distribution's logprobs were logged"
        sample = scorable(Sample.from_rated(SimpleNamespace(reward=1, api_key_id="k"), row), self.model.config.vocab_size)
        batch = make_batch([sample])
        with torch.no_grad():
            scored = token_logprobs(policy_log_dists(self.model, batch), batch)[0].numpy()
        assert np.abs(scored - row.behavior_logprobs).max() < 1e-3


# -- raw clients: connections a test resets as a phone losing signal does -----------------------------
def raw_request(base_url: str, path: str, body: dict, key: str) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"  # what the allow-list answers
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_events(sock: socket.socket, n: int) -> bytes:
    """Read until `n` SSE `data:` events have arrived (or the stream ends)."""
    buf = b""
    while buf.count(b"data: ") < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10).text
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


# the calculator tool the agent tests offer, and a question that wants it
CALC = {
    "type": "object",
    "properties": {"op": {"enum": ["add", "mul"]}, "a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["op", "a"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Add or multiply.", "parameters": CALC}}]
ASK = [{"role": "user", "content": "What is 2 + 3?"}]


def scored(model_dir: Path, sample) -> "np.ndarray":
    """The learner's logprobs of a sample's response tokens (rl/batch.py, its grammars replayed) under
    the weights in `model_dir`, from a transformers forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from liveloop.grammar import Grammars
    from liveloop.rl.batch import make_batch, response_log_dists, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    batch = make_batch([sample], grammars=Grammars(AutoTokenizer.from_pretrained(str(model_dir)), model.config.vocab_size))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(response_log_dists(logits, batch), batch)[0, : len(sample.response_ids)].numpy()
