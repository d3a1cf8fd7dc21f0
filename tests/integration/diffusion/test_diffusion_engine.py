"""The `diffusion` engine in-process on a tiny masked diffusion LM: blocks stream, EOS ends the
response, seeds reproduce, max_tokens holds, swaps go through the gate and bad weights are refused."""

from __future__ import annotations

import asyncio
import pytest
import torch

from liveloop.diffusion.model import TinyModelConfig, tiny_model
from liveloop.diffusion.sampler import SamplerConfig, generate
from liveloop.diffusion.tokenizer import build_tokenizer
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
from liveloop.transport.weights import NamedTensors
from liveloop.server.engines.diffusion_engine import DiffusionEngine

SAMPLER = SamplerConfig(gen_length=16, block_length=4, steps=8, temperature=1.0)
CONFIG = EngineConfig(backend="diffusion", max_model_len=64, seed=0, dtype="float32")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = build_tokenizer()
    d = tmp_path_factory.mktemp("diffusion_engine") / "model"
    tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0).save(d, tok)
    return d


@pytest.fixture
async def engine(model_dir):
    eng = create_engine(CONFIG, model_dir)
    assert isinstance(eng, DiffusionEngine)
    eng.sampler = SAMPLER
    await eng.start()
    yield eng
    await eng.close()


def _req(i, max_tokens=16, seed=None, **kw):
    return GenerationRequest(f"r{i}", (18, 30, 36, 9, 42), SamplingParams(max_tokens=max_tokens, seed=seed, **kw))


async def _collect(engine, request):
    deltas = []
    async with engine.generate(request) as gen:
        async for d in gen:
            deltas.append(d)
        return gen.version, deltas


async def test_streams_blocks_matches_the_sampler_and_seed_reproduces(engine):
    v, deltas = await _collect(engine, _req(0, seed=5))
    ids = [t for d in deltas for t in d.token_ids]
    lps = [x for d in deltas for x in d.logprobs]
    assert v == 0 and len(ids) == len(lps) and deltas[-1].finish_reason in ("stop", "length")
    assert all(d.finish_reason is None for d in deltas[:-1]) and all(len(d.token_ids) <= 4 for d in deltas)
    # the same seed through the sampler directly: the engine's tokens are its prefix up to the first EOS
    out = generate(engine.model, torch.tensor([[18, 30, 36, 9, 42]]), SAMPLER, torch.Generator().manual_seed(5))
    full = out.response_ids[0].tolist()
    assert full[: len(ids)] == ids
    eos = engine.model.eos_id
    if eos in full:
        assert ids[-1] == eos and eos not in ids[:-1] and deltas[-1].finish_reason == "stop"
    assert lps == pytest.approx(out.commit_logprobs[0, : len(ids)].tolist())
    _, again = await _collect(engine, _req(1, seed=5))
    assert [t for d in again for t in d.token_ids] == ids


async def test_max_tokens_and_stop_tokens(engine):
    _, deltas = await _collect(engine, _req(0, max_tokens=3, seed=1, stop_token_ids=()))
    ids = [t for d in deltas for t in d.token_ids]
    assert len(ids) <= 3
    if engine.model.eos_id not in ids:
        assert len(ids) == 3 and deltas[-1].finish_reason == "length"
    assert engine.request_sampler(_req(0, max_tokens=5)).gen_length == 8  # rounded up to whole blocks
    # greedy + every id a stop token: the first token ends the response
    _, deltas = await _collect(engine, _req(0, temperature=0.0, stop_token_ids=tuple(range(58))))
    assert [len(d.token_ids) for d in deltas] == [1] and deltas[0].finish_reason == "stop"


async def test_swap_is_atomic_and_bad_weights_are_refused(engine):
    state = {k: v.clone() for k, v in engine.model.net.state_dict().items()}
    # a generation in flight keeps version 0; the swap waits for it
    async with engine.generate(_req(0, seed=2)) as gen:
        swap = asyncio.create_task(engine.update_weights(NamedTensors({k: v * 0.5 for k, v in state.items()}), 1))
        await asyncio.sleep(0.05)
        assert not swap.done() and engine.version == 0
        _ = [d async for d in gen]
        assert gen.version == 0
    await swap
    assert engine.version == 1
    k0 = next(iter(state))
    assert torch.allclose(engine.model.net.state_dict()[k0], state[k0] * 0.5)
    bad = {k: v.clone() for k, v in state.items()}
    bad[k0][0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        await engine.update_weights(NamedTensors(bad), 2)
    assert engine.version == 1 and torch.allclose(engine.model.net.state_dict()[k0], state[k0] * 0.5)
    with pytest.raises(ValueError, match="missing tensors"):
        await engine.update_weights(NamedTensors({k0: state[k0]}), 3)


async def test_update_from_checkpoint_dir(engine, model_dir, tmp_path):
    from liveloop.diffusion.model import load_diffusion_model

    m, tok = load_diffusion_model(model_dir)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.01)
    m.save(tmp_path / "v7", tok)
    await engine.update_weights(str(tmp_path / "v7"), 7)
    assert engine.version == 7
    for (k, a), b in zip(engine.model.net.state_dict().items(), m.net.state_dict().values()):
        assert torch.allclose(a, b), k


async def test_block_schedule_and_remote_code_come_from_the_config(model_dir):
    import dataclasses

    config = dataclasses.replace(CONFIG, diffusion_block_length=2, diffusion_steps_per_block=3, trust_remote_code=True)
    eng = create_engine(config, model_dir)
    await eng.start()
    try:
        assert eng.trust_remote_code
        # 5 tokens: three blocks of 2, three steps each
        assert eng.request_sampler(_req(0, max_tokens=5)) == SamplerConfig(gen_length=6, block_length=2, steps=9)
        _, deltas = await _collect(eng, _req(0, max_tokens=5, seed=1, stop_token_ids=()))
        assert all(len(d.token_ids) <= 2 for d in deltas)
    finally:
        await eng.close()
    plain = create_engine(CONFIG, model_dir)  # nothing configured, no build record: the sampler's defaults
    await plain.start()
    try:
        assert plain.request_sampler(_req(0, max_tokens=5)) == SamplerConfig(gen_length=8, block_length=8, steps=8)
    finally:
        await plain.close()
