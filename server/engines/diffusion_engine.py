"""The `diffusion` backend: the LLaDA-style sampler of `liveloop.diffusion` behind the Engine protocol.

One worker thread owns the masked diffusion LM and runs one request at a time (FIFO). The response is a
fixed `gen_length` window (max_tokens rounded up to whole blocks, within max_model_len) decoded block by
block; each block is streamed as one delta as soon as it is final, and the stream ends at the first EOS
(or stop token), which is included, as with a causal engine. A swap drains through the `VersionGate`,
then copies the new state into the model on the worker thread, so each response is one version's: a
request a swap ended at its drain deadline stops at its next block boundary (or before it starts) with
an "abort" delta, before the swap, queued behind it on the inbox, runs.

Behavior logprobs: a masked diffusion LM has no causal per-token likelihood. `TokenDelta.logprobs[i]` is
the commit-time logprob of token i (its log-probability under the raw, temperature-1 distribution at the
denoising step that committed it, given the partially masked context then). It is a decode-time score
for monitoring, not log mu(y_i | y_<i): BGPO does not use it. What BGPO needs is recorded as for every
response: prompt ids, response ids (EOS-truncated; BGPO pads them back with EOS to its `gen_length`) and
the policy version; BGPO recomputes the ELBO with its own shared masks. `top_logprobs` are not produced
(None) and `top_p` is ignored (Gumbel-max sampling over the full distribution at `temperature`).

Configuration (`[engine]`): `diffusion_block_length` and `diffusion_steps_per_block` set the block
schedule (unset: the model's build record, else the sampler's defaults); `trust_remote_code` loads
checkpoints that bring their own model code (LLaDA, Dream).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from liveloop.diffusion.model import MaskedDiffusionLM, load_diffusion_model
from liveloop.diffusion.sampler import SamplerConfig, generate
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, TokenDelta, aborted
from liveloop.server.engines.threaded import Emit, Stop, Submit, Swap, ThreadedEngine
from liveloop.transport.weights import load_state


@dataclass
class _Job:
    request: GenerationRequest
    emit: Emit
    generator: torch.Generator
    cancelled: threading.Event


def sampler_defaults(model_path: str | Path) -> SamplerConfig:
    """The sampler setting recorded by the tiny default's build, else SamplerConfig's defaults."""
    record = Path(model_path) / "liveloop_diffusion_build.json"
    if record.is_file():
        saved = json.loads(record.read_text()).get("sampler")
        if saved:
            return SamplerConfig(**saved)
    return SamplerConfig()


def engine_sampler(config: EngineConfig, model_path: str | Path) -> SamplerConfig:
    """The block schedule the engine decodes with: `config.diffusion_block_length` and
    `diffusion_steps_per_block` where set, else the model's recorded setting (`sampler_defaults`).
    Only the block length and the steps per block matter: each request sets its own length and
    temperature (`DiffusionEngine.request_sampler`)."""
    base = sampler_defaults(model_path)
    if config.diffusion_block_length is None and config.diffusion_steps_per_block is None:
        return base
    block = config.diffusion_block_length or base.block_length
    steps = config.diffusion_steps_per_block or base.steps // (base.gen_length // base.block_length)
    return SamplerConfig(gen_length=block, block_length=block, steps=steps)


class DiffusionEngine(ThreadedEngine):
    name = "diffusion"
    thread_name = "liveloop-diffusion-engine"

    def __init__(self, config: EngineConfig, model_path: str | Path, sampler: SamplerConfig | None = None):
        super().__init__(config, model_path)
        self.sampler = sampler  # None: `engine_sampler(config, model_path)` at start
        self.trust_remote_code = config.trust_remote_code
        self.model: MaskedDiffusionLM | None = None
        self.tokenizer: Any = None

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        self.model, self.tokenizer = load_diffusion_model(self.model_path, self.trust_remote_code, self.config.dtype)
        self.model.eval()
        if self.sampler is None:
            self.sampler = engine_sampler(self.config, self.model_path)
        if weights_path:
            load_state(self.model.net, self._read_checkpoint(Path(weights_path)))
        self._start_worker(version)

    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> _Job:
        return _Job(request, emit, generator, cancelled)

    def _weights_module(self) -> torch.nn.Module:
        return self.model.net

    def _read_checkpoint(self, path: Path) -> Mapping[str, torch.Tensor]:
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        loaded, _ = load_diffusion_model(path, self.trust_remote_code, dtype=dtype)
        return loaded.net.state_dict()

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(1)
        while not self._closing.is_set():
            match self._inbox.get():
                case Stop():
                    return
                case Swap() as swap:
                    self._swap(swap)  # every request ahead of it in the inbox has ended
                case Submit(job):
                    self._serve(job)

    def _serve(self, job: _Job) -> None:
        if job.cancelled.is_set():
            job.emit(aborted())
            return
        try:
            if not self._generate(job):
                job.emit(aborted())
        except BaseException as exc:  # report to the request, keep serving the others
            job.emit(exc)

    def request_sampler(self, request: GenerationRequest) -> SamplerConfig:
        """The sampler for one request: max_tokens rounded up to whole blocks (capped by max_model_len),
        steps per block as configured, the request's temperature."""
        base = self.sampler
        room = self.max_model_len - len(request.prompt_ids)
        blocks = min(math.ceil(request.sampling.max_tokens / base.block_length), room // base.block_length)
        if blocks < 1:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens leaves no room for a block of "
                             f"{base.block_length} within max_model_len {self.max_model_len}")
        steps_per_block = base.steps // (base.gen_length // base.block_length)
        return SamplerConfig(gen_length=blocks * base.block_length, block_length=base.block_length,
                             steps=blocks * steps_per_block, temperature=request.sampling.temperature)

    @torch.no_grad()
    def _generate(self, job: _Job) -> bool:
        """Run one request; False if it was cancelled before its last block was sent."""
        s = job.request.sampling
        cfg = self.request_sampler(job.request)
        stop = {self.model.eos_id, *s.stop_token_ids}
        sent, finished = 0, False

        def on_block(b: int, response: torch.Tensor, logprobs: torch.Tensor) -> bool:
            nonlocal sent, finished
            if job.cancelled.is_set():
                return True
            ids, lps = response[0].tolist(), logprobs[0].tolist()
            end, finish = len(ids), None
            for i in range(sent, len(ids)):
                if ids[i] in stop:
                    end, finish = i + 1, "stop"
                    break
            if finish is None and end >= s.max_tokens:
                end, finish = s.max_tokens, "length"
            if finish is None and b == cfg.gen_length // cfg.block_length - 1:
                finish = "length"
            job.emit(TokenDelta(ids[sent:end], lps[sent:end], None, finish))
            sent, finished = end, finish is not None
            return finished

        prompt = torch.tensor([job.request.prompt_ids], dtype=torch.long)
        generate(self.model, prompt, cfg, job.generator, on_block=on_block)
        return finished
