"""A weight swap's drain has a deadline: a streaming client that stops reading keeps its generation
admitted, yet a swap returns, the next request is served by the new version, and the stalled response
is logged with finish_reason "abort" under the OLD version, every behavior logprob exactly what the old
weights give (no token of it came from the new weights, no old KV was continued by them).

The engine-level tests drive the backends in-process: a straggler stopped mid-generation ends its
stream with "abort" (it neither hangs nor raises), and one not started yet never starts."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest


from liveloop.devtools import ServerProcess, perturbed_checkpoint
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
from liveloop.transport.weights import NamedTensors

from .conftest import ADMIN_KEY, USER_KEY, Reference, open_store, start_server, stop_server

BACKENDS = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])]
MAX_TOKENS = 400
TOLERANCE = {"hf": 1e-4, "vllm": 1e-3}  # vLLM's kernels differ from a transformers forward pass


def endless_copy(model_dir: Path, out: Path) -> Path:
    """The same weights and tokenizer, declaring as EOS a token the model does not produce after an
    answer (it repeats `<|end|>` there): responses run to max_tokens. The tiny model otherwise ends
    every answer within ~50 tokens, and so short a stream fits in the socket buffers whatever its
    client does: it would finish, not stall."""
    shutil.copytree(model_dir, out)
    for name, key, value in [
        ("tokenizer_config.json", "eos_token", "<|endoftext|>"),
        ("generation_config.json", "eos_token_id", 0),
        ("config.json", "eos_token_id", 0),
    ]:
        data = json.loads((out / name).read_text())
        data[key] = value
        (out / name).write_text(json.dumps(data, indent=2))
    return out


def start_server_with_deadline(tmp: Path, model_dir: Path, backend: str, deadline: float) -> ServerProcess:
    return start_server(tmp, model_dir, backend, engine_extra=f"drain_deadline_seconds = {deadline}")


class StalledStream:
    """A streaming chat completion whose client reads up to the first event that carries a token, then
    stops reading and keeps the connection open (the role-only first chunk comes before any token: a
    swap that raced it would abort a response with nothing generated yet). Small receive buffer and segments: on loopback (64 KiB MSS) the kernel would
    otherwise buffer megabytes for the server, and a short response would fit in them entirely."""

    def __init__(self, base_url: str, body: dict):
        url = urlsplit(base_url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.settimeout(120)
        self.sock.connect((url.hostname, url.port))
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {USER_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + payload)
        buf = b""
        while (first := _first_token_event(buf)) is None:
            data = self.sock.recv(4096)
            if not data:
                raise AssertionError(f"the server closed the stream early: {buf[:500]!r}")
            buf += data
        lines = buf.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        assert lines[0].split()[1] == "200", lines[0]
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        self.version = int(headers["x-liveloop-policy-version"])
        self.id = json.loads(first)["id"]

    def close(self) -> None:
        self.sock.close()


def _first_token_event(buf: bytes) -> bytes | None:
    """The JSON of the first complete server-sent event in a raw HTTP response that carries a token
    (its choice has logprobs), or None while none has fully arrived."""
    if b"\r\n\r\n" not in buf:
        return None
    body = buf.split(b"\r\n\r\n", 1)[1]
    for event in body.split(b"data: ")[1:]:
        if b"\n\n" not in event:
            return None
        data = event.split(b"\n\n", 1)[0]
        if data.strip() == b"[DONE]":
            return None
        if any(choice.get("logprobs") for choice in json.loads(data)["choices"]):
            return data
    return None


def _chat(base_url: str, content: str) -> httpx.Response:
    body = {"model": "liveloop-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 16, "seed": 3}
    return httpx.post(base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=120)


def _wait_for_row(store, response_id: str):
    for _ in range(240):  # 60 s: the record of a vanished client is written by the batch writer
        row = store.feedback.get_response(response_id)
        if row is not None:
            return row
        time.sleep(0.25)
    raise AssertionError(f"response {response_id} was never logged")


@pytest.mark.parametrize("backend", BACKENDS)
def test_swap_ends_a_stalled_stream_at_the_deadline(backend, model_dir, tmp_path):
    model_dir = endless_copy(model_dir, tmp_path / "v0")
    new_dir = perturbed_checkpoint(model_dir, tmp_path / "v1")
    server = start_server_with_deadline(tmp_path / "server", model_dir, backend, deadline=2.0)
    stalled = None
    try:
        body = {
            "model": "liveloop-tiny",
            "messages": [{"role": "user", "content": "Tell me a very long story about the sea."}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "seed": 7,
            "logprobs": True,
            "top_logprobs": 20,  # ~1.4 kB events: the server's send buffers fill after ~200 tokens
        }
        stalled = StalledStream(server.base_url, body)
        assert stalled.version == 0
        swap = httpx.post(
            server.base_url + "/admin/weights",
            json={"path": str(new_dir), "note": "swap past a stalled client"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=120,  # without the deadline this never returns
        )
        assert swap.status_code == 200, swap.text
        assert swap.json()["version"] == 1
        after = _chat(server.base_url, "hi")
        assert after.status_code == 200, after.text
        assert after.json()["policy_version"] == 1 and after.headers["x-liveloop-policy-version"] == "1"
        stalled.close()
        store = open_store(server)
        row = _wait_for_row(store, stalled.id)
        store.close()
    finally:
        if stalled is not None:
            stalled.close()
        stop_server(server)
    assert row.finish_reason == "abort" and row.policy_version == 0
    n = len(row.response_ids)
    assert 0 < n < MAX_TOKENS, n
    prompt, response = row.prompt_ids.tolist(), row.response_ids.tolist()
    old = Reference(model_dir).logprobs(prompt, response).numpy()
    new = Reference(new_dir).logprobs(prompt, response).numpy()
    assert np.abs(row.behavior_logprobs - old).max() < TOLERANCE[backend], "a logged token does not match the old weights"
    assert np.abs(row.behavior_logprobs - new).max() > 1e-3  # the two versions are distinguishable
    assert "drain deadline were ended" in server.log_path.read_text()


# -- the engines themselves ------------------------------------------------------------------------


PROMPT = (1, 17, 33, 49, 65)  # no stop tokens below: the generation would run to MAX_TOKENS


async def _straggler_then_swap(engine, new_dir: Path) -> tuple[list, list, list, int]:
    """Admit two generations; read some deltas of the first and none of the second; swap. Returns the
    deltas read before the swap, what each stream gives after it, and the engine's preempted count."""
    sampling = SamplingParams(max_tokens=MAX_TOKENS, seed=5)
    async with engine.generate(GenerationRequest("running", PROMPT, sampling)) as running, \
            engine.generate(GenerationRequest("unstarted", PROMPT, sampling)) as unstarted:
        assert running.version == unstarted.version == 0
        stream = running.__aiter__()
        before = []
        while sum(len(d.token_ids) for d in before) < 20:
            before.append(await stream.__anext__())
        await asyncio.wait_for(engine.update_weights(str(new_dir), 1), 120)
        assert engine.version == 1
        after = [d async for d in stream]
        never = [d async for d in unstarted]
    return before, after, never, engine.swap_preempted


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_ends_stragglers_before_new_weights(backend, model_dir, tmp_path):
    new_dir = perturbed_checkpoint(model_dir, tmp_path / "v1")
    config = EngineConfig(
        backend=backend, model=str(model_dir), drain_deadline_seconds=0.05, checkpoint_dir=str(tmp_path / "ck")
    )

    async def scenario():
        engine = create_engine(config, model_dir)
        await engine.start()
        try:
            return await _straggler_then_swap(engine, new_dir)
        finally:
            await engine.close()

    before, after, never, preempted = asyncio.run(scenario())
    assert preempted == 2
    # both streams end at once with "abort" (neither hangs nor raises): the one never read produced
    # nothing, the running one nothing past the point it was read to
    assert [(d.token_ids, d.finish_reason) for d in never] == [([], "abort")]
    assert [(d.token_ids, d.finish_reason) for d in after] == [([], "abort")]
    assert all(d.finish_reason is None for d in before)
    ids = [t for d in before for t in d.token_ids]
    lps = np.array([lp for d in before for lp in d.logprobs])
    assert len(lps) == len(ids) >= 20
    old = Reference(model_dir).logprobs(PROMPT, ids).numpy()
    assert np.abs(lps - old).max() < TOLERANCE[backend], "a token does not match the old weights"


def test_diffusion_engine_ends_an_unstarted_straggler(tmp_path):
    from liveloop.diffusion.model import TinyModelConfig, tiny_model
    from liveloop.diffusion.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0)
    model.save(tmp_path / "model", tok)
    config = EngineConfig(backend="diffusion", max_model_len=64, drain_deadline_seconds=0.05)

    async def scenario():
        engine = create_engine(config, tmp_path / "model")
        await engine.start()
        try:
            weights = NamedTensors({k: v.clone() for k, v in engine.model.net.state_dict().items()})
            request = GenerationRequest("unstarted", (18, 30, 36, 9, 42), SamplingParams(max_tokens=16, seed=1))
            async with engine.generate(request) as gen:
                await asyncio.wait_for(engine.update_weights(weights, 1), 60)
                deltas = [d async for d in gen]
            async with engine.generate(request) as gen:  # the engine serves on, on the new version
                served = (gen.version, [d async for d in gen][-1].finish_reason)
            return deltas, engine.swap_preempted, served
        finally:
            await engine.close()

    deltas, preempted, served = asyncio.run(scenario())
    assert [(d.token_ids, d.finish_reason) for d in deltas] == [([], "abort")] and preempted == 1
    assert served[0] == 1 and served[1] in ("stop", "length")
