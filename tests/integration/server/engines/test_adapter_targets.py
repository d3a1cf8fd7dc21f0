"""Adapters beyond the attention projections in the `hf` engine: on the MoE model's fused experts (peft
`target_parameters`: nested ParamWrappers, not LoRA Linear layers) and on lm_head. A request with such
an adapter gets a peft forward's logprobs with it, a base request the plain model's bit for bit, even
while it runs beside adapter requests; an adapter naming a parameter the model lacks, or a Linear's
weight as a raw parameter, is refused with the old adapter still serving; a full-weight swap and the
unload back to the plain model see through the nested wrappers; vLLM refuses such adapters by reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from liveloop.devtools import perturbed_checkpoint
from liveloop.server.config import EngineConfig
from liveloop.server.engines.adapters import AdapterSpec, read_adapter
from liveloop.segments import Lineage
from liveloop.server.engines.base import AdapterUnusable, GenerationRequest, SamplingParams
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.engines.vllm.engine import adapter_refusal
from liveloop.transport.weights import CheckpointDir

from .test_adapters import PROMPT, _edited, _reference

EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _random_adapter(model_dir: Path, out: Path, seed: int, modules: tuple[str, ...], parameters: tuple[str, ...] = ()) -> Path:
    """A peft adapter with random A and B (it changes the outputs) on `modules` and `parameters`."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(modules), target_parameters=list(parameters) or None,
                        init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(out), save_embedding_layers=False)
    return out


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("target_adapters")
    dirs = {
        "experts": _random_adapter(model_dir, root / "experts", 1, ("q_proj", "v_proj"), EXPERTS),
        "experts_only": _random_adapter(model_dir, root / "experts_only", 2, (), EXPERTS),
        "lm_head": _random_adapter(model_dir, root / "lm_head", 3, ("q_proj", "lm_head")),
        "attention": _random_adapter(model_dir, root / "attention", 4, ("q_proj", "k_proj", "v_proj", "o_proj")),
    }
    dirs["absent"] = _edited(dirs["experts"], root / "absent", target_parameters=["mlp.experts.no_such_proj"])
    dirs["linear_weight"] = _edited(dirs["experts"], root / "linear_weight", target_parameters=["self_attn.q_proj.weight"])
    return dirs


@pytest.fixture
async def engine(model_dir):
    eng = HFEngine(EngineConfig(backend="hf", model=str(model_dir), max_adapters=4, max_lora_rank=4), model_dir)
    await eng.start()
    yield eng
    await eng.close()


def _request(segment: str | None, max_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(f"r-{segment}", PROMPT, SamplingParams(max_tokens=max_tokens, seed=7), lineage=Lineage(segment))


async def _collect(engine, request: GenerationRequest) -> tuple[list[int], list[float], bool]:
    ids, lps = [], []
    async with engine.generate(request) as gen:
        async for delta in gen:
            ids += delta.token_ids
            lps += delta.logprobs
    return ids, lps, gen.adapter


def _matches(served, model_dir: Path, adapter: Path | None, base: Path | None = None) -> bool:
    ids, lps, _ = served
    return bool(torch.allclose(torch.tensor(lps), _reference(model_dir, adapter, ids, base), atol=1e-5))


def _has_lora(engine: HFEngine) -> bool:
    return any("lora_" in name for name in engine.model.state_dict())


async def test_experts_and_lm_head_adapters_are_served_per_request(engine, model_dir, adapters):
    plain = await _collect(engine, _request(None))
    for segment, name, version in (("e", "experts", 1), ("o", "experts_only", 2), ("h", "lm_head", 3), ("t", "attention", 4)):
        await engine.update_adapter(segment, CheckpointDir(adapters[name]), version)
    # concurrently: the worker switches every tuner layer (ParamWrappers too) between the groups' steps
    e, o, h, t, base = await asyncio.gather(*(_collect(engine, _request(s)) for s in ("e", "o", "h", "t", None)))
    assert all(served[2] for served in (e, o, h, t)) and not base[2]
    assert base == plain, "a base request beside experts and lm_head adapters is the plain model's, bit for bit"
    for served, name in ((e, "experts"), (o, "experts_only"), (h, "lm_head"), (t, "attention")):
        assert _matches(served, model_dir, adapters[name]), name
        assert not _matches(served, model_dir, None), f"{name} changes nothing: the test cannot tell routing apart"


@pytest.mark.parametrize("bad, message", [("absent", "no_such_proj"), ("linear_weight", "q_proj.weight")])
async def test_an_adapter_on_parameters_the_model_cannot_adapt_is_refused(engine, model_dir, adapters, bad, message):
    with pytest.raises(AdapterUnusable, match=message):  # into the plain model: it stays plain
        await engine.update_adapter("c", CheckpointDir(adapters[bad]), 1)
    assert engine.adapter_version("c") is None and not _has_lora(engine)

    await engine.update_adapter("e", CheckpointDir(adapters["experts"]), 1)
    with pytest.raises(AdapterUnusable, match=message):  # into the wrapped model: its adapters stay
        await engine.update_adapter("e", CheckpointDir(adapters[bad]), 2)
    served = await _collect(engine, _request("e"))
    assert engine.adapter_version("e") == 1 and _matches(served, model_dir, adapters["experts"])


async def test_a_full_weight_swap_and_the_unload_see_through_nested_wrappers(engine, model_dir, adapters, tmp_path):
    plain = await _collect(engine, _request(None))
    await engine.update_adapter("e", CheckpointDir(adapters["experts"]), 1)
    v1 = perturbed_checkpoint(model_dir, tmp_path / "v1")
    await engine.update_weights(str(v1), 1)  # writes the experts' base tensors under their plain names
    e, base = await _collect(engine, _request("e")), await _collect(engine, _request(None))
    assert _matches(e, model_dir, adapters["experts"], base=v1) and _matches(base, model_dir, None, base=v1)
    await engine.update_weights(str(model_dir), 2)
    await engine.update_adapter("e", None, 2)
    assert await _collect(engine, _request(None)) == plain  # after the worker's unload (a queued message)
    assert not _has_lora(engine), "the last adapter gone, the model is the plain model again"
    assert not any("base_layer" in name for name, _ in engine.model.named_modules())


def test_the_spec_reads_target_parameters_and_vllm_refuses_them_and_lm_head(adapters):
    experts, lm_head, attention = (read_adapter(adapters[n], 8) for n in ("experts", "lm_head", "attention"))
    assert experts.target_parameters == tuple(sorted(EXPERTS)) and attention.target_parameters == ()
    assert "target_parameters" in adapter_refusal(experts) and "hf" in adapter_refusal(experts)
    assert "lm_head" in adapter_refusal(lm_head)
    assert "lm_head" in adapter_refusal(AdapterSpec(Path("x"), 4, r".*(q_proj|lm_head)"))
    assert adapter_refusal(attention) is None and adapter_refusal(AdapterSpec(Path("x"), 4, r".*q_proj")) is None
