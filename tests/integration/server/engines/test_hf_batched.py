"""The `hf` engine as a batched engine on the tiny default model: concurrent requests advance in one
forward per step (seen by a forward hook on the real model) with logprobs equal to a plain
single-sequence forward, requests join, leave and are cancelled at token boundaries, `max_num_seqs`
bounds the batch, and `keep` swaps continue running generations under the new weights with each
token's version and logprob those of the weights that sampled it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch

from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.transport.weights import NamedTensors
from liveloop.server.engines.hf.engine import HFEngine, engine_device

PROMPTS = [(5, 6, 7, 8), (9, 10), (11, 12, 13, 14, 15, 16, 17), (18,), (19, 20, 21), (22, 23, 24, 25, 26)]


async def _engine(model_dir, **kw) -> HFEngine:
    eng = HFEngine(EngineConfig(backend="hf", model=str(model_dir), **kw), model_dir)
    await eng.start()
    return eng


@pytest.fixture
async def engine(model_dir):
    eng = await _engine(model_dir)
    yield eng
    await eng.close()


@pytest.fixture
async def keep_engine(model_dir):
    eng = await _engine(model_dir, swap_mode="keep")
    yield eng
    await eng.close()


def _req(i: int, prompt: tuple[int, ...], max_tokens: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, **kw))


@dataclass
class Stream:
    """What one generation produced: per token its id, logprob and the version that sampled it."""

    admitted: int = -1
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None


async def _collect(engine, request, stream: Stream | None = None, stop_after: int | None = None) -> Stream:
    stream = stream if stream is not None else Stream()
    async with engine.generate(request) as gen:
        stream.admitted = gen.version
        async for d in gen:
            v = gen.version if d.version is None else d.version
            stream.ids += d.token_ids
            stream.logprobs += d.logprobs
            stream.versions += [v] * len(d.token_ids)
            stream.finish = d.finish_reason
            if stop_after is not None and len(stream.ids) >= stop_after:
                break
    return stream


@torch.no_grad()
def _forward_logprobs(model, prompt, ids) -> torch.Tensor:
    full = torch.tensor([list(prompt) + ids], device=next(model.parameters()).device)
    lp = torch.log_softmax(model(input_ids=full).logits[0, len(prompt) - 1 : -1].float(), -1).cpu()
    return lp.gather(1, torch.tensor(ids)[:, None])[:, 0]


def _batch_sizes(model) -> list[int]:
    """The batch size of every forward the model runs from now on (a hook on the real model)."""
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    return sizes


async def test_concurrent_requests_share_forwards_and_match_a_plain_forward(engine):
    sizes = _batch_sizes(engine.model)
    first = [asyncio.create_task(_collect(engine, _req(i, p, seed=i))) for i, p in enumerate(PROMPTS[:4])]
    await asyncio.sleep(0.02)  # later ones join a running batch
    later = [asyncio.create_task(_collect(engine, _req(10 + i, p, max_tokens=12, seed=i))) for i, p in enumerate(PROMPTS[4:])]
    streams = await asyncio.gather(*first, *later)
    prompts = PROMPTS[:4] + PROMPTS[4:]
    for prompt, s in zip(prompts, streams):
        assert s.finish == "length" and len(s.ids) == (24 if prompt in PROMPTS[:4] else 12)
        assert torch.allclose(torch.tensor(s.logprobs), _forward_logprobs(engine.model, prompt, s.ids), atol=1e-4)
    tokens = sum(len(s.ids) for s in streams)
    # decode steps carry several rows: far fewer forwards than tokens, and some of 4 rows or more
    assert max(sizes) >= 4 and len(sizes) < tokens / 2


async def test_a_seed_gives_the_same_tokens_alone_and_in_a_batch(engine):
    alone = await _collect(engine, _req(0, PROMPTS[0], seed=7))
    crowd = [asyncio.create_task(_collect(engine, _req(i, p, seed=100 + i))) for i, p in enumerate(PROMPTS[1:])]
    together = await _collect(engine, _req(9, PROMPTS[0], seed=7))
    await asyncio.gather(*crowd)
    assert together.ids == alone.ids
    assert torch.allclose(torch.tensor(together.logprobs), torch.tensor(alone.logprobs), atol=1e-4)


async def test_a_client_that_leaves_frees_its_row_and_the_others_continue(engine):
    sizes = _batch_sizes(engine.model)
    leaver = asyncio.create_task(_collect(engine, _req(0, PROMPTS[0], max_tokens=200), stop_after=3))
    stayers = [asyncio.create_task(_collect(engine, _req(i, p, max_tokens=40))) for i, p in enumerate(PROMPTS[1:3], 1)]
    left = await leaver
    streams = await asyncio.gather(*stayers)
    assert 3 <= len(left.ids) < 200  # tokens reach a stream a few at a time (engine.delta_interval_ms)
    for prompt, s in zip(PROMPTS[1:3], streams):
        assert len(s.ids) == 40
        assert torch.allclose(torch.tensor(s.logprobs), _forward_logprobs(engine.model, prompt, s.ids), atol=1e-4)
    # the leaver's row was dropped at a token boundary: the last steps ran without it
    assert sizes[-1] <= 2 and not engine._rows()


async def test_max_num_seqs_bounds_the_batch(model_dir):
    engine = await _engine(model_dir, max_num_seqs=2)
    try:
        sizes = _batch_sizes(engine.model)
        streams = await asyncio.gather(*(_collect(engine, _req(i, p, max_tokens=8)) for i, p in enumerate(PROMPTS)))
        assert all(len(s.ids) == 8 for s in streams)
        assert max(sizes) == 2
    finally:
        await engine.close()


def test_the_device_is_the_configured_one(model_dir):
    assert engine_device(EngineConfig(backend="hf")) == torch.device("cpu")  # the default
    auto = engine_device(EngineConfig(backend="hf", device="auto"))
    assert auto.type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
async def test_the_engine_runs_on_cuda_and_matches_a_plain_forward(model_dir):
    engine = await _engine(model_dir, device="cuda")
    try:
        assert next(engine.model.parameters()).device.type == "cuda"
        streams = await asyncio.gather(*(_collect(engine, _req(i, p, seed=i)) for i, p in enumerate(PROMPTS)))
        for prompt, s in zip(PROMPTS, streams):
            assert torch.allclose(torch.tensor(s.logprobs), _forward_logprobs(engine.model, prompt, s.ids), atol=1e-3)
    finally:
        await engine.close()


# -- swaps ------------------------------------------------------------------------------------------


def _perturbed(engine, scale: float = 0.05) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {k: v + scale * torch.randn(v.shape, generator=g) * v.std().clamp(min=1e-3) for k, v in engine.model.state_dict().items()}


def _reference(engine, state):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(engine.model_path, dtype=torch.float32).eval()
    ref.load_state_dict(state, strict=False)
    return ref


async def _wait_for_tokens(streams: list[Stream], n: int) -> None:
    while min(len(s.ids) for s in streams) < n:
        await asyncio.sleep(0.001)


async def test_keep_swap_continues_running_generations_under_the_new_weights(keep_engine):
    engine = keep_engine
    old = {k: v.clone() for k, v in engine.model.state_dict().items()}
    new = _perturbed(engine)
    streams = [Stream() for _ in PROMPTS[:4]]
    tasks = [asyncio.create_task(_collect(engine, _req(i, p, max_tokens=200, seed=i), streams[i])) for i, p in enumerate(PROMPTS[:4])]
    await _wait_for_tokens(streams, 3)
    before = [len(s.ids) for s in streams]  # received before the swap began: sampled by version 0
    held = await engine.update_weights(NamedTensors(new), 1)
    late = await _collect(engine, _req(9, PROMPTS[4], max_tokens=10, seed=9))
    await asyncio.gather(*tasks)
    assert engine.version == 1 and late.admitted == 1 and set(late.versions) == {1}
    assert held < 1.0  # the swap did not wait for 200-token generations
    old_ref, new_ref = _reference(engine, old), _reference(engine, new)
    for prompt, s, n in zip(PROMPTS, streams, before):
        assert s.admitted == 0 and len(s.ids) == 200 and s.finish == "length"
        # version 0 up to the swap, version 1 after it, never back
        switch = s.versions.index(1)
        assert switch >= n and set(s.versions[:switch]) == {0} and set(s.versions[switch:]) == {1}
        lp = torch.tensor(s.logprobs)
        under_old, under_new = _forward_logprobs(old_ref, prompt, s.ids), _forward_logprobs(new_ref, prompt, s.ids)
        # each token's logprob is that of the weights that sampled it, and the two versions differ
        assert torch.allclose(lp[:switch], under_old[:switch], atol=1e-4)
        assert torch.allclose(lp[switch:], under_new[switch:], atol=1e-4)
        assert (under_old[switch:] - under_new[switch:]).abs().max() > 1e-2
    assert torch.allclose(torch.tensor(late.logprobs), _forward_logprobs(new_ref, PROMPTS[4], late.ids), atol=1e-4)


async def test_a_failed_keep_swap_leaves_the_old_version_serving_every_generation(keep_engine):
    engine = keep_engine
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    bad = dict(before)
    name = next(iter(bad))
    bad[name] = torch.full_like(bad[name], float("nan"))
    streams = [Stream() for _ in PROMPTS[:3]]
    tasks = [asyncio.create_task(_collect(engine, _req(i, p, max_tokens=60, seed=i), streams[i])) for i, p in enumerate(PROMPTS[:3])]
    await _wait_for_tokens(streams, 2)
    with pytest.raises(ValueError, match="non-finite"):
        await engine.update_weights(NamedTensors(bad), 1)
    await asyncio.gather(*tasks)
    assert engine.version == 0
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    for prompt, s in zip(PROMPTS, streams):
        assert len(s.ids) == 60 and set(s.versions) == {0}
        assert torch.allclose(torch.tensor(s.logprobs), _forward_logprobs(engine.model, prompt, s.ids), atol=1e-4)


async def test_drain_swap_finishes_running_generations_on_their_version(engine):
    new = _perturbed(engine)
    streams = [Stream() for _ in PROMPTS[:3]]
    tasks = [asyncio.create_task(_collect(engine, _req(i, p, max_tokens=60, seed=i), streams[i])) for i, p in enumerate(PROMPTS[:3])]
    await _wait_for_tokens(streams, 2)
    await engine.update_weights(NamedTensors(new), 1)
    # a drain swap returns only once they are done: all of each ran on version 0
    assert all(len(s.ids) == 60 and set(s.versions) == {0} for s in streams)
    await asyncio.gather(*tasks)
    late = await _collect(engine, _req(9, PROMPTS[0], max_tokens=5))
    assert set(late.versions) == {1} and late.admitted == 1


@pytest.mark.parametrize("interval_ms", [0, 1000])
async def test_tokens_reach_a_stream_merged_within_the_delta_interval(model_dir, interval_ms):
    # 0: every token as it is sampled; a long interval: the first token at once, the rest with the last
    engine = await _engine(model_dir, delta_interval_ms=interval_ms)
    try:
        sizes: list[int] = []
        async with engine.generate(_req(0, PROMPTS[0], seed=3)) as gen:
            async for d in gen:
                sizes.append(len(d.token_ids))
        again = await _collect(engine, _req(1, PROMPTS[0], seed=3))
    finally:
        await engine.close()
    assert sum(sizes) == 24 and sizes[0] == 1  # the first token at once, whatever the interval
    if interval_ms == 0:
        assert len(sizes) == 24  # every token as it is sampled
    else:  # merged: the rest in one piece when 23 tokens take under a second, a few more on a loaded machine
        assert 2 <= len(sizes) < 24 and max(sizes) > 1
    assert torch.allclose(torch.tensor(again.logprobs), _forward_logprobs(engine.model, PROMPTS[0], again.ids), atol=1e-4)
