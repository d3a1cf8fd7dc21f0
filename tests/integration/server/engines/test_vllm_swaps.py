"""vLLM swaps through liveloop's worker extension, with vLLM's insecure (pickle) serialization off:
a checkpoint directory and in-memory named tensors both go live (the tensors through shared memory,
with no checkpoint written and no shared-memory file kept once vLLM has copied it: no second copy of
the weights), a non-finite tensor is refused before vLLM is paused and leaves the old weights serving,
and a `keep` swap under concurrent streams continues them under the new weights, and admits requests
that arrive while it loads: every delta names the version that sampled it, and each token's logprob is
what that version's weights give on a fresh forward over the whole prefix (so no token came from old KV
under new weights), whether the weights were staged beside the serving model or reloaded in the pause.

Staged swaps (`vllm_weight_load = "staged"`, server/engines/vllm/staging.py): the shared_memory
transport's files go into the worker with no copy of the engine's, the staged weights serve exactly what
vLLM's own reload serves (the same engine, the same weights: equal logprobs), weights refused while
staging (a tensor missing) leave the serving version serving and the engine healthy, and a transport
file removed before the worker opened it is staged from the server's verified mapping.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from liveloop.devtools import perturbed_checkpoint
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
from liveloop.transport.weights import NamedTensors, WeightsRejected
from liveloop.server.engines.vllm.worker import SHM_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

INSECURE = "VLLM_ALLOW_INSECURE_SERIALIZATION"
TOL = 1e-3  # vLLM against transformers in float32


@dataclass
class Stream:
    prompt: tuple[int, ...]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int | None] = field(default_factory=list)  # per token, from its delta
    deltas: int = 0
    finish: str | None = None
    admitted: int | None = None


@pytest.fixture(scope="module")
def v1_dir(model_dir, tmp_path_factory) -> Path:
    return perturbed_checkpoint(model_dir, tmp_path_factory.mktemp("vllm_swaps") / "v1", scale=0.2)


def _hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _reference_logprobs(model, prompt: tuple[int, ...], ids: list[int]) -> list[float]:
    """Each token's logprob under `model`, given the prompt and the tokens before it (one fresh forward)."""
    full = torch.tensor([list(prompt) + ids])
    with torch.no_grad():
        logits = model(full).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    n = len(prompt)
    return [lp[n - 1 + i, t].item() for i, t in enumerate(ids)]


def _our_files() -> set[str]:
    return {p.name for p in SHM_ROOT.glob("liveloop-weights-*")}


async def _generate(engine, prompt, request_id, max_tokens=8, temperature=0.0, seed=0) -> Stream:
    s = Stream(prompt)
    request = GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))
    async with engine.generate(request) as gen:
        s.admitted = gen.version
        async for delta in gen:
            s.deltas += 1
            s.ids += delta.token_ids
            s.logprobs += delta.logprobs
            s.versions += [delta.version] * len(delta.token_ids)
            s.finish = delta.finish_reason
    return s


def _close(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


async def test_swaps_through_the_worker_extension_without_insecure_serialization(model_dir, v1_dir, tmp_path):
    assert INSECURE not in os.environ
    pushed = tmp_path / "pushed"
    engine = create_engine(EngineConfig(backend="vllm", model=str(model_dir), checkpoint_dir=str(pushed)), model_dir)
    before = _our_files()
    await engine.start()
    try:
        assert INSECURE not in os.environ  # starting vLLM did not turn pickle on either
        prompt = (5, 6, 7, 8)
        v0 = await _generate(engine, prompt, "v0")
        assert v0.admitted == 0 and set(v0.versions) == {0}
        ref0 = _hf(model_dir)
        assert _close(v0.logprobs, _reference_logprobs(ref0, prompt, v0.ids)) <= TOL

        await engine.update_weights(str(v1_dir), 1)  # a checkpoint directory: its path crosses
        v1 = await _generate(engine, prompt, "v1")
        ref1 = _hf(v1_dir)
        assert v1.admitted == 1 and set(v1.versions) == {1}
        assert _close(v1.logprobs, _reference_logprobs(ref1, prompt, v1.ids)) <= TOL
        assert _close(v1.logprobs, _reference_logprobs(ref0, prompt, v1.ids)) > 10 * TOL, "v1 serves v0's weights"

        # in memory: version 0's tensors as transformers names them (fused experts, tied head)
        held = await engine.update_weights(NamedTensors(ref0.state_dict()), 2)
        assert held >= 0 and engine.version == 2
        assert not pushed.exists(), "named tensors were written as a checkpoint"
        assert _our_files() == before, "the serving version's shared memory was kept (a second copy of the weights)"
        v2 = await _generate(engine, prompt, "v2")
        assert v2.ids == v0.ids and set(v2.versions) == {2}
        assert _close(v2.logprobs, _reference_logprobs(ref0, prompt, v2.ids)) <= TOL

        bad = {k: v.clone() for k, v in ref1.state_dict().items()}
        bad["model.layers.1.self_attn.q_proj.weight"][0, 0] = float("nan")
        with pytest.raises(Exception, match="non-finite"):
            await engine.update_weights(NamedTensors(bad), 3)
        assert engine.version == 2 and engine.healthy()
        again = await _generate(engine, prompt, "v2-again")
        assert again.ids == v2.ids and _close(again.logprobs, v2.logprobs) <= TOL, "a refused swap changed the weights"
        assert _our_files() == before, "the refused tensors' shared memory was left behind"

        await engine.update_weights(NamedTensors(ref1.state_dict()), 4)  # the previous version's file goes
        v4 = await _generate(engine, prompt, "v4")
        assert v4.ids == v1.ids and _close(v4.logprobs, v1.logprobs) <= TOL
        assert _our_files() == before
    finally:
        await engine.close()
    assert _our_files() == before
    assert INSECURE not in os.environ


@pytest.mark.parametrize("load", ["staged", "reload"])
async def test_keep_swap_continues_running_streams_under_the_new_weights(model_dir, v1_dir, load):
    config = EngineConfig(backend="vllm", model=str(model_dir), swap_mode="keep", max_model_len=512, vllm_weight_load=load)
    engine = create_engine(config, model_dir)
    await engine.start()
    prompts = [(5, 6, 7, 8), (9, 10, 11), (12, 13, 14, 15, 16), (17, 18)]
    try:
        streams = [Stream(p) for p in prompts]
        started = [asyncio.Event() for _ in prompts]

        async def run(i: int) -> None:
            s = streams[i]
            request = GenerationRequest(f"keep-{i}", s.prompt, SamplingParams(max_tokens=300, temperature=1.0, seed=i))
            async with engine.generate(request) as gen:
                s.admitted = gen.version
                async for delta in gen:
                    assert len(delta.token_ids) == len(delta.logprobs)
                    s.deltas += 1
                    s.ids += delta.token_ids
                    s.logprobs += delta.logprobs
                    s.versions += [delta.version] * len(delta.token_ids)
                    s.finish = delta.finish_reason
                    if s.ids:
                        started[i].set()

        tasks = [asyncio.create_task(run(i)) for i in range(len(prompts))]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        swap = asyncio.create_task(engine.update_weights(str(v1_dir), 1))
        # arrives while the weights load: admitted at once (no gate), its tokens named by version
        during = asyncio.create_task(_generate(engine, (19, 20, 21), "during", max_tokens=16, temperature=1.0, seed=7))
        held = await swap
        assert held >= 0 and engine.version == 1 and engine.swap_preempted == 0 and engine.last_load == load
        late = await _generate(engine, (5, 6, 7, 8), "after", max_tokens=8)  # admitted after the swap
        streams.append(await asyncio.wait_for(during, 120))
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    finally:
        await engine.close()

    assert late.admitted == 1 and set(late.versions) == {1}
    ref = {0: _hf(model_dir), 1: _hf(v1_dir)}
    spanning = 0
    for s in streams:
        assert s.admitted in (0, 1) and s.finish in ("stop", "length")
        assert s.versions and all(v in (0, 1) for v in s.versions)
        assert s.versions == sorted(s.versions), f"versions go back: {s.versions}"
        cut = s.versions.count(0)
        spanning += 0 < cut < len(s.ids)
        # every token's logprob is its own version's, over the full prefix: the KV was recomputed
        for version, lo, hi in ((0, 0, cut), (1, cut, len(s.ids))):
            if lo < hi:
                want = _reference_logprobs(ref[version], s.prompt, s.ids)[lo:hi]
                assert _close(s.logprobs[lo:hi], want) <= TOL, f"tokens {lo}:{hi} are not version {version}'s"
        if 0 < cut < len(s.ids):  # and not the other version's
            other = _reference_logprobs(ref[0], s.prompt, s.ids)[cut:]
            assert _close(s.logprobs[cut:], other) > 10 * TOL
    assert spanning >= 1, "no stream was running across the swap"


async def test_staged_swaps_map_the_transport_and_serve_what_a_reload_serves(model_dir, v1_dir, namespace):
    from liveloop.transport import TransportConfig, make_receiver, make_sender
    from liveloop.transport import shared_memory as shm

    config = TransportConfig(backend="shared_memory", namespace=namespace)
    sender, receiver = make_sender(config), make_receiver(config)
    ref0, ref1 = _hf(model_dir), _hf(v1_dir)

    def publish(version: int, state: dict) -> object:
        sender.start_update(version)
        sender.send(state)
        return sender.finish()

    engine = create_engine(EngineConfig(backend="vllm", model=str(model_dir), swap_mode="keep"), model_dir)
    before = _our_files()
    await engine.start()
    try:
        prompt = (5, 6, 7, 8)
        seen: set[str] = set()

        async def watch() -> None:  # every engine copy made while the swap runs
            while True:
                seen.update(_our_files() - before)
                await asyncio.sleep(0.001)

        handle = publish(1, ref1.state_dict())
        watcher = asyncio.create_task(watch())
        with receiver.open(handle) as source:
            await engine.update_weights(source, 1)
        watcher.cancel()
        assert engine.last_load == "staged" and engine.version == 1
        assert not seen, f"the engine copied the transport's memory: {seen}"
        staged = await _generate(engine, prompt, "staged")
        assert _close(staged.logprobs, _reference_logprobs(ref1, prompt, staged.ids)) <= TOL

        engine._unstaged = "this test compares with vLLM's reload"  # the same weights, reloaded in the pause
        await engine.update_weights(NamedTensors(ref1.state_dict()), 2)
        assert engine.last_load == "reload"
        reloaded = await _generate(engine, prompt, "reloaded")
        assert (reloaded.ids, reloaded.logprobs) == (staged.ids, staged.logprobs), "staged and reloaded weights differ"
        engine._unstaged = None

        missing = {k: v for k, v in ref0.state_dict().items() if k != "model.layers.2.self_attn.q_norm.weight"}
        with pytest.raises(WeightsRejected, match="missing tensors.*layers.2.self_attn.q_norm"):
            await engine.update_weights(NamedTensors(missing), 3)
        assert engine.healthy() and engine.version == 2
        again = await _generate(engine, prompt, "after-refusal")
        assert (again.ids, again.logprobs) == (staged.ids, staged.logprobs), "a refused swap changed the weights"

        handle = publish(4, ref0.state_dict())
        with receiver.open(handle) as source:
            shm.remove_version(namespace, 4)  # a newer publish removed its files: the server's mapping stays
            await engine.update_weights(source, 4)
        assert engine.last_load == "staged" and engine.version == 4
        v4 = await _generate(engine, prompt, "moved")
        assert _close(v4.logprobs, _reference_logprobs(ref0, prompt, v4.ids)) <= TOL
        assert _our_files() == before, "the copy staged for the moved files was left behind"
    finally:
        await engine.close()
