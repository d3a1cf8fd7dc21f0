"""The hf engine in a process of its own (`engine.hf_worker = "process"`, server/engines/hf/process.py)
against the same engine on a thread: the same tokens and logprobs for the same seeds in a batch, the
same adapters, keep swaps that continue running generations with each token's version, drain swaps
that end a straggler with "abort"; and its faults: a killed engine process ends its streams with an
error and reports unhealthy, a killed server takes its engine process with it, a start that fails
says why and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from liveloop.devtools import random_lora_adapter
from liveloop.server.config import EngineConfig
from liveloop.segments import Lineage
from liveloop.server.engines.base import GenerationRequest, SamplingParams, create_engine
from liveloop.server.engines.hf.process import EngineProcessExited, HFProcessEngine
from liveloop.transport.weights import CheckpointDir, NamedTensors

PROMPTS = [(5, 6, 7, 8), (9, 10), (11, 12, 13, 14, 15, 16, 17), (18,), (19, 20, 21), (22, 23, 24, 25, 26)]


async def _started(model_dir: Path, worker: str, **kw):
    engine = create_engine(EngineConfig(backend="hf", model=str(model_dir), hf_worker=worker, **kw), model_dir)
    await engine.start()
    return engine


async def _served(engine, i: int, prompt, max_tokens: int = 16, segment: str | None = None, seed: int | None = None):
    ids, lps, versions, finish = [], [], [], None
    request = GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, seed=i if seed is None else seed), lineage=Lineage(segment))
    async with engine.generate(request) as gen:
        async for d in gen:
            ids += d.token_ids
            lps += d.logprobs
            versions += [gen.version if d.version is None else d.version] * len(d.token_ids)
            finish = d.finish_reason
    return ids, lps, versions, finish, gen.version


def _perturbed(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    g = torch.Generator().manual_seed(1)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) * v.std().clamp(min=1e-3) for k, v in state.items()}


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


async def test_the_process_engine_serves_what_the_thread_engine_serves(model_dir):
    results = {}
    for worker in ("thread", "process"):
        engine = await _started(model_dir, worker)
        try:
            results[worker] = await asyncio.gather(*(_served(engine, i, p) for i, p in enumerate(PROMPTS)))
        finally:
            await engine.close()
    assert isinstance(engine, HFProcessEngine)
    for (ids_t, lps_t, *_), (ids_p, lps_p, _, finish, version) in zip(results["thread"], results["process"]):
        assert ids_p == ids_t and _close(lps_p, lps_t) and finish == "length" and version == 0


async def test_adapters_load_and_serve_through_the_process(model_dir, tmp_path):
    adapter = random_lora_adapter(model_dir, tmp_path / "a1", 1, rank=4, targets=("q_proj", "v_proj"))
    served = {}
    for worker in ("thread", "process"):
        engine = await _started(model_dir, worker, max_adapters=2, max_lora_rank=4)
        try:
            await engine.update_adapter("a", CheckpointDir(adapter), 5)
            served[worker] = await asyncio.gather(_served(engine, 0, PROMPTS[0], segment="a"), _served(engine, 1, PROMPTS[0], segment=None, seed=0))
            await engine.update_adapter("a", None, 6)
        finally:
            await engine.close()
    (a_t, base_t), (a_p, base_p) = served["thread"], served["process"]
    assert a_p[0] == a_t[0] and _close(a_p[1], a_t[1]) and a_p[4] == 5
    assert base_p[0] == base_t[0] and _close(base_p[1], base_t[1]) and base_p[4] == 0
    assert not _close(a_p[1][:4], base_p[1][:4]), "the adapter changes nothing: the test cannot tell them apart"


async def test_a_keep_swap_continues_running_generations_across_the_process(model_dir):
    new = _perturbed(model_dir)
    engine = await _started(model_dir, "process", swap_mode="keep")
    try:
        running = [asyncio.create_task(_served(engine, i, p, max_tokens=150)) for i, p in enumerate(PROMPTS[:3])]
        await asyncio.sleep(0.2)
        await engine.update_weights(NamedTensors(new), 1)
        late = await _served(engine, 9, PROMPTS[4], max_tokens=10)
        streams = await asyncio.gather(*running)
    finally:
        await engine.close()
    reference = await _started(model_dir, "thread")
    try:
        await reference.update_weights(NamedTensors(new), 1)
        late_reference = await _served(reference, 9, PROMPTS[4], max_tokens=10)
    finally:
        await reference.close()
    assert late[4] == 1 and set(late[2]) == {1} and late[0] == late_reference[0] and _close(late[1], late_reference[1])
    for ids, _, versions, finish, admitted in streams:
        assert admitted == 0 and len(ids) == 150 and finish == "length"
        switch = versions.index(1)  # version 0 up to the swap, version 1 after it, never back
        assert switch > 0 and set(versions[:switch]) == {0} and set(versions[switch:]) == {1}


async def test_a_drain_swap_ends_a_straggler_with_abort(model_dir):
    engine = await _started(model_dir, "process", drain_deadline_seconds=0.3)
    try:
        finishes: list[str | None] = []

        async def straggler() -> None:
            request = GenerationRequest("slow", PROMPTS[0], SamplingParams(max_tokens=400, seed=1))
            async with engine.generate(request) as gen:
                async for d in gen:
                    finishes.append(d.finish_reason)
                    if len(finishes) == 1:
                        await asyncio.sleep(1.0)  # stops reading: the swap's deadline passes

        task = asyncio.create_task(straggler())
        await asyncio.sleep(0.2)
        await engine.update_weights(NamedTensors(_perturbed(model_dir)), 1)
        await task
        after = await _served(engine, 3, PROMPTS[1], max_tokens=4)
    finally:
        await engine.close()
    assert finishes[-1] == "abort" and engine.swap_preempted == 1
    assert after[4] == 1 and len(after[0]) == 4


async def test_a_killed_engine_process_ends_its_streams_and_reports_unhealthy(model_dir):
    engine = await _started(model_dir, "process", max_model_len=512)
    try:
        got: list[int] = []

        async def reader() -> None:
            request = GenerationRequest("long", PROMPTS[0], SamplingParams(max_tokens=480, seed=2))
            async with engine.generate(request) as gen:
                async for d in gen:
                    got.extend(d.token_ids)

        task = asyncio.create_task(reader())
        while not got:
            await asyncio.sleep(0.01)
        os.kill(engine._process.pid, signal.SIGKILL)
        with pytest.raises(EngineProcessExited):
            await asyncio.wait_for(task, 10)
        assert not engine.healthy()
        with pytest.raises(EngineProcessExited):
            await engine.update_weights(NamedTensors(_perturbed(model_dir)), 1)
        with pytest.raises(EngineProcessExited):
            await _served(engine, 1, PROMPTS[1])
        assert engine.version == 0
    finally:
        await engine.close()


def test_the_engine_process_ends_when_its_server_is_killed(model_dir, tmp_path):
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from pathlib import Path
        from liveloop.server.config import EngineConfig
        from liveloop.server.engines.base import create_engine

        async def main():
            model = Path({str(model_dir)!r})
            engine = create_engine(EngineConfig(backend="hf", model=str(model), hf_worker="process"), model)
            await engine.start()
            print(engine._process.pid, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """))
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        child = int(server.stdout.readline())
        server.kill()  # kill -9: no cleanup of its own runs
        server.wait(10)
        deadline = time.monotonic() + 60  # a hang guard, not a speed verdict
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the engine process outlived its server"
    finally:
        if server.poll() is None:
            server.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


async def test_a_start_that_fails_says_why_and_leaves_no_process(tmp_path):
    engine = HFProcessEngine(EngineConfig(backend="hf", model=str(tmp_path), hf_worker="process"), tmp_path)
    with pytest.raises(Exception, match="config.json|not a valid model|does not appear"):
        await engine.start()
    assert engine._process.poll() is not None and not engine.healthy()


async def test_a_group_signal_leaves_the_engine_to_its_server(model_dir):
    # SIGTERM to the process group reaches the engine's process too: it serves on until its server stops it
    engine = await _started(model_dir, "process")
    try:
        os.kill(engine._process.pid, signal.SIGTERM)
        os.kill(engine._process.pid, signal.SIGINT)
        served = await _served(engine, 0, PROMPTS[0], max_tokens=6)
        assert engine.healthy() and len(served[0]) == 6
    finally:
        await engine.close()
    assert engine._process.poll() == 0  # stopped by its server, in order


async def test_the_engine_process_imports_nothing_from_the_working_directory_and_holds_no_secret(model_dir, tmp_path, monkeypatch):
    """A `torch.py` planted in a writable working directory is not what the engine process imports (it ran
    as the service when `-m` put the directory first on its path), and the server's keys are not in the
    engine process's environment."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "torch.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted')\n")
    monkeypatch.chdir(planted)
    monkeypatch.setenv("LIVELOOP_ADMIN_KEYS", "sk-admin-secret")
    monkeypatch.setenv("SOME_API_TOKEN", "t0ken")
    engine = await _started(model_dir, "process")
    try:
        ids, *_ = await _served(engine, 1, (5, 6, 7), max_tokens=4)
        assert len(ids) == 4 and not marker.exists()
        environ = Path(f"/proc/{engine._process.pid}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0] for e in environ if e}
        assert b"LIVELOOP_ADMIN_KEYS" not in names and b"SOME_API_TOKEN" not in names and b"PATH" in names
    finally:
        await engine.close()
