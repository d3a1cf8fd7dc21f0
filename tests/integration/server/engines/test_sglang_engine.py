"""The `sglang` backend against the SGLang stand-in (tests/standins/sglang_server.py, a real HTTP server
running the tiny model): a keep swap mid-response splits the response's versions at the swap, each
token's logprob the one its own version computes; a drain swap ends a straggler at the deadline with
"abort"; a checkpoint SGLang refuses leaves the old version serving; keep swaps drain on a server whose
radix cache is on; a server that is down or goes away gives clear errors and an unhealthy engine; an
adapter SGLang refuses is AdapterUnusable."""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path

import httpx
import pytest
import torch

from liveloop.devtools import free_port, perturbed_checkpoint, random_lora_adapter
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import AdapterUnusable, GenerationRequest, SamplingParams, TokenDelta, create_engine
from liveloop.server.engines.sglang_engine import SGLangEngine, SGLangError, SGLangUnreachable
from liveloop.transport.weights import CheckpointDir, WeightsRejected

PROMPT = (5, 6, 7, 8)


@pytest.fixture(scope="module")
def v1_dir(model_dir, tmp_path_factory) -> Path:
    return perturbed_checkpoint(model_dir, tmp_path_factory.mktemp("sglang") / "v1")


def _engine(model_dir: Path, url: str, tmp_path: Path, **kw) -> SGLangEngine:
    config = EngineConfig(backend="sglang", model=str(model_dir), sglang_url=url, checkpoint_dir=str(tmp_path / "pushed"),
                          sglang_health_seconds=0.2, **kw)
    engine = create_engine(config, model_dir)
    assert isinstance(engine, SGLangEngine)
    return engine


def _request(rid: str, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(rid, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0))


def _slow_down(standin, seconds: float | None) -> None:
    """SGLang's testing aid, POST /slow_down: each forward sleeps `seconds` (None: no sleep)."""
    httpx.post(standin.url + "/slow_down", json={"forward_sleep_time": seconds}, trust_env=False).raise_for_status()


async def _collect(engine, request) -> tuple[int, list[TokenDelta]]:
    async with engine.generate(request) as gen:
        return gen.version, [d async for d in gen]


def _teacher_logprobs(checkpoint: Path, prompt: tuple[int, ...], ids: list[int]) -> list[float]:
    """log p(ids[t] | prompt + ids[:t]) under `checkpoint`, one forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    seq = torch.tensor([list(prompt) + ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(seq).logits[0].float(), dim=-1)
    return [float(logprobs[len(prompt) + t - 1, tok]) for t, tok in enumerate(ids)]


async def test_keep_swap_mid_response_splits_versions(model_dir, v1_dir, sglang_standin, tmp_path):
    engine = _engine(model_dir, sglang_standin.url, tmp_path, swap_mode="keep")
    await engine.start()
    try:
        assert engine.swap_keeps  # the stand-in runs with its radix cache off
        _slow_down(sglang_standin, 0.05)
        request = GenerationRequest("keep", PROMPT, SamplingParams(max_tokens=30, temperature=0.0))
        deltas: list[TokenDelta] = []
        async with engine.generate(request) as gen:
            stream = gen.__aiter__()
            deltas.append(await anext(stream))  # the first token, under version 0
            held = await engine.update_weights(str(v1_dir), 1)
            deltas += [d async for d in stream]
        assert gen.version == 0 and engine.version == 1 and held >= 0
        versions = [d.version for d in deltas if d.token_ids]
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions), versions
        ids = [t for d in deltas for t in d.token_ids]
        assert deltas[-1].finish_reason in ("stop", "length")
        # each token's behaviour logprob is the one its own version computes on the tokens before it
        want = {0: _teacher_logprobs(model_dir, PROMPT, ids), 1: _teacher_logprobs(v1_dir, PROMPT, ids)}
        t = 0
        for d in deltas:
            for lp in d.logprobs:
                assert math.isclose(lp, want[d.version][t], abs_tol=1e-4), (t, d.version)
                t += 1
    finally:
        _slow_down(sglang_standin, None)
        await engine.close()


async def test_drain_deadline_aborts_a_straggler(model_dir, v1_dir, sglang_standin, tmp_path):
    engine = _engine(model_dir, sglang_standin.url, tmp_path, swap_mode="drain", drain_deadline_seconds=0.3)
    await engine.start()
    try:
        _slow_down(sglang_standin, 0.05)
        deltas: list[TokenDelta] = []

        async def straggler():
            async with engine.generate(GenerationRequest("slow", PROMPT, SamplingParams(max_tokens=200, temperature=0.0))) as gen:
                async for d in gen:
                    deltas.append(d)
            return gen.version

        task = asyncio.create_task(straggler())
        while not deltas:
            await asyncio.sleep(0.01)
        await engine.update_weights(str(v1_dir), 1)
        assert await task == 0
        assert deltas[-1].finish_reason == "abort" and engine.swap_preempted == 1 and engine.version == 1
        assert all(d.version in (0, None) for d in deltas)  # nothing of it came from version 1
        _slow_down(sglang_standin, None)
        version, after = await _collect(engine, _request("after"))
        assert version == 1 and after[-1].finish_reason in ("stop", "length")
    finally:
        _slow_down(sglang_standin, None)
        await engine.close()


async def test_a_refused_checkpoint_leaves_the_old_version_serving(model_dir, sglang_standin, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(model_dir / "config.json", broken / "config.json")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    engine = _engine(model_dir, sglang_standin.url, tmp_path)
    await engine.start(version=3)
    try:
        _, before = await _collect(engine, _request("before"))
        with pytest.raises(WeightsRejected, match="sglang refused"):
            await engine.update_weights(broken, 4)
        assert engine.version == 3 and engine.healthy()
        assert httpx.get(sglang_standin.url + "/get_weight_version", trust_env=False).json() == {"weight_version": "3"}
        version, again = await _collect(engine, _request("again"))
        assert version == 3 and [d.version for d in again] == [3] * len(again)
        assert [(d.token_ids, d.logprobs) for d in again] == [(d.token_ids, d.logprobs) for d in before]
    finally:
        await engine.close()


async def test_what_sglang_serves_outlives_the_copy_it_was_handed(model_dir, v1_dir, sglang_standin, tmp_path):
    """The activator hands engines a verified private copy and removes it after the swap; SGLang keeps
    serving from the path it loaded (a refused update reloads the served weights from there). The
    engine gives SGLang a directory of its own, removed only once SGLang serves another: after the copy
    is gone, a refused update still rolls SGLang back and the engine keeps serving the version."""
    engine = _engine(model_dir, sglang_standin.url, tmp_path)
    handed = tmp_path / "handed"
    shutil.copytree(v1_dir, handed)
    await engine.start(version=1, weights_path=handed)
    shutil.rmtree(handed)  # the start point's private copy goes once the engine started
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(model_dir / "config.json", broken / "config.json")
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    try:
        _, before = await _collect(engine, _request("before"))
        handed.mkdir()
        for f in v1_dir.iterdir():
            shutil.copy(f, handed / f.name)
        await engine.update_weights(CheckpointDir(handed), 2)
        shutil.rmtree(handed)  # the activator's copy goes after the swap
        served = httpx.get(sglang_standin.url + "/get_model_info", trust_env=False).json()["model_path"]
        assert Path(served).is_dir() and Path(served).resolve() != handed.resolve()
        with pytest.raises(WeightsRejected, match="sglang refused"):
            await engine.update_weights(broken, 3)  # SGLang reloads what it served, from `served`
        assert engine.version == 2 and engine.healthy() and Path(served).is_dir()
        version, again = await _collect(engine, _request("again"))
        assert version == 2 and [(d.token_ids, d.logprobs) for d in again] == [(d.token_ids, d.logprobs) for d in before]
        await engine.update_weights(CheckpointDir(model_dir), 4)  # the configured model: served in place
        assert not Path(served).exists()  # the engine's own copy goes once SGLang serves another directory
    finally:
        await engine.close()


async def test_no_server_is_a_clear_error(model_dir, tmp_path):
    engine = _engine(model_dir, f"http://127.0.0.1:{free_port()}", tmp_path)
    with pytest.raises(SGLangUnreachable, match="did not answer GET /get_model_info"):
        await engine.start()
    assert not engine.healthy()


@pytest.mark.parametrize("own_sglang_standin", [{"api_key": "sk-sglang-test"}], indirect=True)
async def test_a_server_started_with_an_api_key_is_called_with_it(model_dir, own_sglang_standin, tmp_path, monkeypatch):
    """SGLang with `--api-key`: without the key liveloop cannot start against it (a clear error, not a
    hang); with the key in the environment variable the config names, it serves."""
    monkeypatch.delenv("LIVELOOP_TEST_SGLANG_KEY", raising=False)
    keyless = _engine(model_dir, own_sglang_standin.url, tmp_path, sglang_api_key_env="LIVELOOP_TEST_SGLANG_KEY")
    with pytest.raises(SGLangError, match="HTTP 401"):
        await keyless.start()
    await keyless.close()
    monkeypatch.setenv("LIVELOOP_TEST_SGLANG_KEY", "sk-sglang-test")
    engine = _engine(model_dir, own_sglang_standin.url, tmp_path, sglang_api_key_env="LIVELOOP_TEST_SGLANG_KEY")
    await engine.start()
    try:
        version, deltas = await _collect(engine, _request("keyed", 4))
        assert version == 0 and sum(len(d.token_ids) for d in deltas) == 4 and deltas[-1].finish_reason == "length"
    finally:
        await engine.close()


@pytest.mark.parametrize("own_sglang_standin", [{"radix_cache": True}], indirect=True)
async def test_radix_cache_on_then_the_server_goes_away(model_dir, v1_dir, own_sglang_standin, tmp_path):
    engine = _engine(model_dir, own_sglang_standin.url, tmp_path, swap_mode="keep")
    await engine.start()
    try:
        assert not engine.swap_keeps and engine.healthy()  # old prefix KV could serve new weights: it drains
        own_sglang_standin.stop()
        with pytest.raises(SGLangUnreachable):
            await _collect(engine, _request("gone"))
        assert not engine.healthy()  # at once, not at the next health poll
        with pytest.raises(SGLangUnreachable):
            await engine.update_weights(str(v1_dir), 1)
        assert engine.version == 0
    finally:
        await engine.close()
    assert not engine.healthy()


async def test_an_adapter_sglang_refuses(model_dir, sglang_standin, tmp_path):
    adapter = random_lora_adapter(model_dir, tmp_path / "adapter", seed=0)
    engine = _engine(model_dir, sglang_standin.url, tmp_path, max_adapters=2)
    await engine.start()
    try:
        with pytest.raises(AdapterUnusable, match="sglang could not load it"):
            await engine.update_adapter("cozy", CheckpointDir(adapter), 5)
        assert engine.adapter_version("cozy") is None and engine.healthy()
    finally:
        await engine.close()
