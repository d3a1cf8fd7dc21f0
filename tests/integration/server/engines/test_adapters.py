"""Per-segment LoRA adapters in the `hf` engine, with real peft adapters saved by the test: each request
is served by its segment's adapter (its logprobs are a peft forward's with that adapter) or, without
one, by the base (the plain model's); an adapter swap leaves other segments bit-identical and lets a
running generation finish on the adapter it started with; `update_adapter(segment, None)` serves the
base again; an unusable adapter is refused with the old one still serving; max_adapters bounds what is
held; a full-weight swap keeps the adapters; engines without adapter support refuse them."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from liveloop.devtools import perturbed_checkpoint, random_lora_adapter
from liveloop.server.config import EngineConfig
from liveloop.segments import Lineage
from liveloop.server.engines.base import (
    AdaptersUnsupported,
    AdapterUnusable,
    Engine,
    GenerationRequest,
    SamplingParams,
    create_engine,
)
from liveloop.transport.weights import CheckpointDir, NamedTensors
from liveloop.server.engines.hf.engine import HFEngine

PROMPT = (5, 6, 7, 8)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _save_adapter(model_dir: Path, out: Path, seed: int, r: int = 4) -> Path:
    return random_lora_adapter(model_dir, out, seed, rank=r, targets=tuple(TARGETS))


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    dirs = {name: _save_adapter(model_dir, root / name, seed) for name, seed in (("a1", 1), ("a2", 2), ("b1", 3))}
    dirs["rank8"] = _save_adapter(model_dir, root / "rank8", 4, r=8)
    dirs["absent"] = _edited(dirs["a1"], root / "absent", target_modules=["q_proj", "no_such_proj"])
    dirs["misfit"] = _edited(dirs["a1"], root / "misfit", r=2, lora_alpha=4)  # weights of rank 4
    dirs["experts"] = _edited(dirs["a1"], root / "experts", target_modules=["q_proj", "experts"])
    return dirs


def _edited(src: Path, out: Path, **config: object) -> Path:
    shutil.copytree(src, out)
    saved = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps(saved | config))
    return out


def _engine(model_dir: Path, **kw) -> HFEngine:
    kw.setdefault("max_adapters", 4)
    kw.setdefault("max_lora_rank", 4)
    return HFEngine(EngineConfig(backend="hf", model=str(model_dir), **kw), model_dir)


@pytest.fixture
async def engine(model_dir):
    eng = _engine(model_dir)
    await eng.start()
    yield eng
    await eng.close()


@dataclass(frozen=True)
class Served:
    version: int
    adapter: bool
    ids: list[int]
    logprobs: list[float]


def _request(segment: str | None, max_tokens: int = 12, seed: int = 7) -> GenerationRequest:
    return GenerationRequest(f"r-{segment}", PROMPT, SamplingParams(max_tokens=max_tokens, seed=seed), lineage=Lineage(segment))


async def _collect(engine, request: GenerationRequest) -> Served:
    ids, lps = [], []
    async with engine.generate(request) as gen:
        async for delta in gen:
            ids += delta.token_ids
            lps += delta.logprobs
    return Served(gen.version, gen.adapter, ids, lps)


@torch.no_grad()
def _reference(model_dir: Path, adapter: Path | None, ids: list[int], base: Path | None = None) -> torch.Tensor:
    """The logprobs of `ids` after PROMPT under the base model (or `base`), with `adapter` through peft."""
    model = AutoModelForCausalLM.from_pretrained(str(base or model_dir), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    full = torch.tensor([list(PROMPT) + ids])
    lp = torch.log_softmax(model(input_ids=full).logits[0, len(PROMPT) - 1 : -1].float(), -1)
    return lp.gather(1, torch.tensor(ids)[:, None])[:, 0]


def _matches(served: Served, model_dir: Path, adapter: Path | None, base: Path | None = None) -> bool:
    want = _reference(model_dir, adapter, served.ids, base)
    return bool(torch.allclose(torch.tensor(served.logprobs), want, atol=1e-5))


def _has_lora(engine: HFEngine) -> bool:
    return any("lora_" in name for name in engine.model.state_dict())


async def test_requests_are_served_by_their_segments_adapter(engine, model_dir, adapters):
    assert engine.supports_adapters and isinstance(engine, Engine)
    assert await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 5) >= 0
    await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 7)
    assert (engine.adapter_version("a"), engine.adapter_version("b"), engine.adapter_version("zz")) == (5, 7, None)
    # concurrently: the worker interleaves their steps, switching adapters between them
    a, b, base, unknown = await asyncio.gather(*(_collect(engine, _request(s)) for s in ("a", "b", None, "zz")))
    assert (a.version, a.adapter, b.version, b.adapter) == (5, True, 7, True)
    assert (base.version, base.adapter, unknown.version, unknown.adapter) == (0, False, 0, False)
    assert _matches(a, model_dir, adapters["a1"]) and _matches(b, model_dir, adapters["b1"])
    assert _matches(base, model_dir, None) and _matches(unknown, model_dir, None)
    assert not _matches(a, model_dir, None), "adapter a changes nothing: the test cannot tell routing apart"


async def test_a_swap_leaves_other_segments_bit_identical(engine, adapters):
    base_plain = await _collect(engine, _request(None))  # no adapter loaded yet: the plain model
    await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 3)
    await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
    b_before = await _collect(engine, _request("b"))
    a_before = await _collect(engine, _request("a"))
    await engine.update_adapter("a", CheckpointDir(adapters["a2"]), 2)
    a_after = await _collect(engine, _request("a"))
    b_after = await _collect(engine, _request("b"))
    base_after = await _collect(engine, _request(None))
    assert (a_before.version, a_after.version) == (1, 2) and a_after.logprobs != a_before.logprobs
    assert b_after == b_before  # tokens and logprobs, bit for bit
    assert base_after == base_plain


async def test_a_running_generation_finishes_on_its_adapter(engine, model_dir, adapters):
    await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
    request = GenerationRequest("old", PROMPT, SamplingParams(max_tokens=150, seed=1), lineage=Lineage("a"))
    ids, lps = [], []
    async with engine.generate(request) as old:
        stream = aiter(old)
        first = await anext(stream)
        ids += first.token_ids
        lps += first.logprobs
        await engine.update_adapter("a", CheckpointDir(adapters["a2"]), 2)
        new = asyncio.create_task(_collect(engine, _request("a", max_tokens=20)))
        async for delta in stream:
            ids += delta.token_ids
            lps += delta.logprobs
    new = await new
    assert old.version == 1 and len(ids) == 150 and new.version == 2
    assert _matches(Served(1, True, ids, lps), model_dir, adapters["a1"]), "the running generation changed adapter"
    assert _matches(new, model_dir, adapters["a2"])


async def test_none_serves_the_base_again(engine, model_dir, adapters):
    await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
    assert _has_lora(engine)
    assert await engine.update_adapter("a", None, 2) == 0.0
    served = await _collect(engine, _request("a"))
    assert engine.adapter_version("a") is None
    assert (served.version, served.adapter) == (engine.version, False) and _matches(served, model_dir, None)
    assert not _has_lora(engine), "the last adapter gone, the model is the plain model again"


@pytest.mark.parametrize("bad", ["missing", "rank8", "absent", "misfit", "experts"])
async def test_an_unusable_adapter_is_refused_and_the_old_keeps_serving(engine, model_dir, adapters, bad, tmp_path):
    path = adapters.get(bad, tmp_path / "no-such-adapter")
    with pytest.raises(AdapterUnusable):  # the first load, into the plain model: it stays plain
        await engine.update_adapter("c", CheckpointDir(path), 1)
    assert engine.adapter_version("c") is None and not _has_lora(engine)

    await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
    with pytest.raises(AdapterUnusable):
        await engine.update_adapter("a", CheckpointDir(path), 2)
    served = await _collect(engine, _request("a"))
    assert engine.adapter_version("a") == 1 and served.version == 1 and _matches(served, model_dir, adapters["a1"])
    base = await _collect(engine, _request(None))
    assert not base.adapter and _matches(base, model_dir, None)


async def test_max_adapters_bounds_what_is_held(model_dir, adapters):
    engine = _engine(model_dir, max_adapters=2)
    await engine.start()
    try:
        await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
        await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 1)
        with pytest.raises(AdapterUnusable, match="max_adapters"):
            await engine.update_adapter("c", CheckpointDir(adapters["a2"]), 1)
        await engine.update_adapter("a", CheckpointDir(adapters["a2"]), 2)  # a's idle old one is unloaded
        await engine.update_adapter("b", None, 2)
        async with engine.generate(_request("a", max_tokens=4)) as running:  # holds a's version 2
            await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 3)
            with pytest.raises(AdapterUnusable, match="max_adapters"):
                await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 3)
            assert running.version == 2 and [d async for d in running][-1].finish_reason == "length"
        # its generation over, a's version 2 is unloaded: there is room again
        await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 3)
        assert (engine.adapter_version("a"), engine.adapter_version("b")) == (3, 3)
        assert _matches(await _collect(engine, _request("a")), model_dir, adapters["a1"])
    finally:
        await engine.close()


async def test_a_full_weight_swap_keeps_the_adapters(engine, model_dir, adapters, tmp_path):
    await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
    v1 = perturbed_checkpoint(model_dir, tmp_path / "v1")
    assert await engine.update_weights(str(v1), 1) >= 0 and engine.version == 1
    a, base = await _collect(engine, _request("a")), await _collect(engine, _request(None))
    assert _matches(a, model_dir, adapters["a1"], base=v1) and _matches(base, model_dir, None, base=v1)

    plain = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    bad = dict(plain)
    bad["model.layers.0.self_attn.q_proj.weight"] = torch.full_like(bad["model.layers.0.self_attn.q_proj.weight"], float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        await engine.update_weights(NamedTensors(bad), 2)
    assert engine.version == 1 and _matches(await _collect(engine, _request("a")), model_dir, adapters["a1"], base=v1)

    await engine.update_weights(NamedTensors(plain), 2)  # the plain model's names reach the base layers
    a = await _collect(engine, _request("a"))
    assert a.version == 1 and a.adapter and _matches(a, model_dir, adapters["a1"])


async def test_a_keep_swap_continues_adapter_generations_on_the_new_base(model_dir, adapters, tmp_path):
    engine = _engine(model_dir, swap_mode="keep")
    await engine.start()
    try:
        await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
        v1 = perturbed_checkpoint(model_dir, tmp_path / "v1")
        request = GenerationRequest("long", PROMPT, SamplingParams(max_tokens=150, seed=1), lineage=Lineage("a"))
        ids, lps, versions = [], [], set()
        async with engine.generate(request) as gen:
            stream = aiter(gen)
            first = await anext(stream)
            ids += first.token_ids
            lps += first.logprobs
            await engine.update_weights(str(v1), 1)  # does not wait for the 150 tokens
            swapped_at = len(ids)
            async for delta in stream:
                ids += delta.token_ids
                lps += delta.logprobs
                versions.add(delta.version)
        assert gen.version == 1 and gen.adapter and len(ids) == 150 and swapped_at < 150
        assert versions == {None}  # an adapter generation records its adapter's version
        # its tokens up to some point came from the old base with a1, the rest from v1 with a1
        lp = torch.tensor(lps)
        old, new = _reference(model_dir, adapters["a1"], ids), _reference(model_dir, adapters["a1"], ids, base=v1)
        split = next(k for k in range(len(ids) + 1) if k == len(ids) or not abs(lp[k] - old[k]) < 1e-5)
        assert 0 < split < len(ids) and torch.allclose(lp[split:], new[split:], atol=1e-5)
    finally:
        await engine.close()


@pytest.mark.parametrize("backend", ["hf", "diffusion", "vllm"])
async def test_engines_without_adapters_refuse_them(backend, tmp_path, adapters):
    engine = create_engine(EngineConfig(backend=backend, model=str(tmp_path)), tmp_path)  # loads nothing
    assert not engine.supports_adapters and engine.adapter_version("a") is None
    with pytest.raises(AdaptersUnsupported):
        await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)


async def test_a_segment_without_adapter_support_is_served_by_the_base(model_dir, adapters):
    engine = _engine(model_dir, max_adapters=0)
    await engine.start()
    try:
        with pytest.raises(AdaptersUnsupported):
            await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
        served = await _collect(engine, _request("a"))
        assert (served.version, served.adapter) == (0, False) and _matches(served, model_dir, None)
    finally:
        await engine.close()
