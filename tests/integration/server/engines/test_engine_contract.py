"""Every backend through the same contract: it satisfies the `Engine` protocol as written (members,
signatures), starts at version 0, streams tokens with their logprobs under the version it records,
reports healthy, swaps in a checkpoint directory as version 1, survives a failed swap on the old
version with its weights intact, takes named tensors too, and reports unhealthy once closed."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from liveloop.devtools import perturbed_checkpoint
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import (
    Engine,
    GenerationRequest,
    SamplingParams,
    create_engine,
)
from liveloop.transport.weights import NamedTensors

VLLM = pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow])
# sglang: against the stand-in (tests/standins/sglang_server.py); hf-process: hf with engine.hf_worker = "process"
BACKENDS = ["hf", "hf-process", "diffusion", VLLM, "sglang"]
SAME = {"hf": 1e-5, "diffusion": 1e-5, "vllm": 1e-3, "sglang": 1e-5}  # the same weights reloaded: logprobs agree to this


@dataclass(frozen=True)
class Subject:
    config: EngineConfig
    model_dir: Path  # version 0
    v1_dir: Path  # a perturbed copy: version 1
    prompt: tuple[int, ...]


@pytest.fixture(scope="module")
def causal_v1(model_dir, tmp_path_factory) -> Path:
    return perturbed_checkpoint(model_dir, tmp_path_factory.mktemp("contract") / "v1")


@pytest.fixture(scope="module")
def diffusion_dirs(tmp_path_factory) -> tuple[Path, Path]:
    from liveloop.diffusion.model import TinyModelConfig, load_diffusion_model, tiny_model
    from liveloop.diffusion.tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("contract_diffusion")
    tok = build_tokenizer()
    tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0).save(root / "v0", tok)
    model, tok = load_diffusion_model(root / "v0")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2 * p.std().clamp(min=1e-3))
    model.save(root / "v1", tok)
    return root / "v0", root / "v1"


@pytest.fixture
def subject(request, model_dir, tmp_path) -> Subject:
    backend = request.param
    if backend == "diffusion":
        v0, v1 = request.getfixturevalue("diffusion_dirs")
        config = EngineConfig(backend="diffusion", model=str(v0), max_model_len=64,
                              diffusion_block_length=4, diffusion_steps_per_block=2)
        return Subject(config, v0, v1, (18, 30, 36, 9, 42))
    extra = {"sglang_url": request.getfixturevalue("sglang_standin").url} if backend == "sglang" else {}
    if backend == "hf-process":
        backend, extra = "hf", {"hf_worker": "process"}
    config = EngineConfig(backend=backend, model=str(model_dir), checkpoint_dir=str(tmp_path / "pushed"), **extra)
    return Subject(config, model_dir, request.getfixturevalue("causal_v1"), (5, 6, 7, 8))


@dataclass(frozen=True)
class Served:
    version: int
    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


async def _generate(engine: Engine, prompt: tuple[int, ...], request_id: str) -> Served:
    request = GenerationRequest(request_id, prompt, SamplingParams(max_tokens=8, temperature=0.0, seed=0))
    ids, lps, finish = [], [], None
    async with engine.generate(request) as gen:
        async for delta in gen:
            ids += delta.token_ids
            lps += delta.logprobs
            finish = delta.finish_reason
    return Served(gen.version, ids, lps, finish)


def _same(a: Served, b: Served, tol: float) -> bool:
    return a.ids == b.ids and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol


def _protocol_members() -> dict[str, object]:
    members = {name: None for name in Engine.__annotations__}
    members.update({k: v for k, v in vars(Engine).items() if not k.startswith("_")})
    return members


@pytest.mark.parametrize("backend", ["hf", "hf-process", "diffusion", "vllm", "sglang"])
def test_backend_satisfies_the_protocol_as_written(backend, tmp_path):
    # building an engine loads nothing (vllm is not imported, sglang calls no server): the signatures are checked as written
    extra = {"hf_worker": "process"} if backend == "hf-process" else {}
    engine = create_engine(EngineConfig(backend=backend.removesuffix("-process"), model=str(tmp_path), **extra), tmp_path)
    assert isinstance(engine, Engine)
    cls = type(engine)
    for name, member in _protocol_members().items():
        if member is None:  # a data attribute
            assert hasattr(engine, name), name
        elif isinstance(member, property):
            assert isinstance(inspect.getattr_static(cls, name), property), name
        else:
            own = getattr(cls, name)
            assert inspect.iscoroutinefunction(own) == inspect.iscoroutinefunction(member), name
            want = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
            have = [(p.name, p.kind, p.default) for p in inspect.signature(own).parameters.values()]
            assert have == want, f"{backend}.{name}{inspect.signature(own)} is not Engine.{name}{inspect.signature(member)}"


@pytest.mark.parametrize("subject", BACKENDS, indirect=True)
async def test_engine_contract(subject, tmp_path):
    backend = subject.config.backend
    engine = create_engine(subject.config, subject.model_dir)
    assert not engine.healthy()
    await engine.start()
    try:
        assert engine.healthy() and engine.version == 0 and engine.swap_preempted == 0
        v0 = await _generate(engine, subject.prompt, "v0")
        assert v0.version == 0 and v0.finish_reason in ("stop", "length")
        assert 0 < len(v0.ids) == len(v0.logprobs) <= 8
        assert all(math.isfinite(lp) and lp <= 0 for lp in v0.logprobs)

        held = await engine.update_weights(str(subject.v1_dir), 1)  # the publisher's call form
        assert held >= 0 and engine.version == 1
        v1 = await _generate(engine, subject.prompt, "v1")
        assert v1.version == 1 and not _same(v1, v0, 1e-3), "version 1 serves the old weights"

        with pytest.raises(Exception):
            await engine.update_weights(str(tmp_path / "no-such-checkpoint"), 2)
        assert engine.version == 1 and engine.healthy()
        again = await _generate(engine, subject.prompt, "v1-again")
        assert again.version == 1 and _same(again, v1, SAME[backend]), "a failed swap changed the weights"

        back = await engine.update_weights(NamedTensors(_state_of(backend, subject.model_dir)), 2)
        assert back >= 0 and engine.version == 2
        v2 = await _generate(engine, subject.prompt, "v2")
        assert v2.version == 2 and _same(v2, v0, SAME[backend]), "named tensors of version 0 did not serve as version 0"
    finally:
        await engine.close()
    assert not engine.healthy()


def _state_of(backend: str, checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors as the backend's model names them in memory."""
    if backend == "diffusion":
        from liveloop.diffusion.model import load_diffusion_model

        return load_diffusion_model(checkpoint)[0].net.state_dict()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).state_dict()
