"""The `hf` backend: plain transformers, no extra install, CPU or GPU.

One worker thread owns the model. It interleaves the active requests one decode step each (with a KV
cache per request), so concurrent streams all progress; behavior logprobs are the raw log-softmax of
the model's logits for the sampled token. A swap drains through the gate, then copies the new state
into the model on the worker thread; a request cancelled by then (a straggler the swap ended) is
dropped with its KV cache and an "abort" delta, never stepped again.

LoRA adapters (`engine.max_adapters > 0`): the first adapter loaded wraps the model with peft (its
adapted projections become LoRA layers around their `base_layer`), further ones are added beside it,
and the wrapper is removed again when the last one goes, so an engine with no adapter loaded runs the
plain model. Each request keeps the adapter it was admitted with; before each step the worker makes
that adapter the active one on every LoRA layer (none for a base request: the layers then compute
their base layer alone, the plain model's result bit for bit). A round of steps visits the requests
grouped by adapter, so the active adapter changes at most once per adapter per round. A full-weight
swap writes the base layers (`BaseWeights` maps the plain model's names onto them) and keeps the
adapters.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from liveloop.server.config import EngineConfig
from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdapterUnusable, GenerationRequest, TokenDelta, aborted
from liveloop.server.engines.lora import BaseWeights, LoraSlots
from liveloop.server.engines.threaded import (
    DropAdapter,
    Emit,
    HasState,
    LoadAdapter,
    Stop,
    Submit,
    Swap,
    ThreadedEngine,
)
from liveloop.server.engines.weights import load_state

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Active:
    request: GenerationRequest
    emit: Emit
    generator: torch.Generator
    cancelled: threading.Event
    cache: Any = None
    next_input: torch.Tensor | None = None
    produced: int = 0
    position: int = 0
    stop: set[int] = field(default_factory=set)
    adapter: str | None = None  # the loaded adapter that serves it (None: the base weights)


class HFEngine(ThreadedEngine):
    name = "hf"
    thread_name = "liveloop-hf-engine"

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.model: Any = None
        self.supports_adapters = config.max_adapters > 0
        self._lora: LoraSlots | None = None  # the worker thread's; set at start when adapters are on

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=_DTYPES[self.config.dtype], trust_remote_code=self.config.trust_remote_code
        )
        self.model.eval()
        if weights_path:
            load_state(self.model, self._read_checkpoint(Path(weights_path)))
        if self.supports_adapters:
            self._lora = LoraSlots(self.model)
        self._start_worker(version)

    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> _Active:
        return _Active(request, emit, generator, cancelled, stop=set(request.sampling.stop_token_ids))

    def _weights_module(self) -> HasState:
        if self._lora is not None and self._lora.wrapped:
            return BaseWeights(self.model)
        return self.model

    def _read_checkpoint(self, path: Path) -> Mapping[str, torch.Tensor]:
        # through transformers' own loader: checkpoints on disk may use another layout (e.g. MoE
        # experts saved one by one, fused in memory), which from_pretrained converts
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            str(path), dtype=next(self.model.parameters()).dtype, trust_remote_code=self.config.trust_remote_code
        ).state_dict()

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(1)
        active: list[_Active] = []
        while not self._closing.is_set():
            block = not active
            while True:
                try:
                    message = self._inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if isinstance(message, Stop):
                    return
                self._handle(message, active)
            for a in sorted(active, key=_by_adapter):
                if a.cancelled.is_set():
                    a.emit(aborted())  # nobody reads it if the client went away; a preempted stream ends
                    active.remove(a)
                    continue
                try:
                    finished = self._step(a)
                except BaseException as exc:  # report to the request, keep serving the others
                    a.emit(exc)
                    finished = True
                if finished:
                    active.remove(a)

    def _handle(self, message: Swap | Submit | LoadAdapter | DropAdapter, active: list[_Active]) -> None:
        match message:
            case Swap():
                # the gate admits no request while a swap is pending, and the ones it ended are
                # cancelled; either way no old KV cache is continued by new weights
                for a in active:
                    a.emit(aborted())
                active.clear()
                self._swap(message)
            case Submit(job, adapter):
                job.adapter = adapter
                if adapter is not None and (self._lora is None or adapter not in self._lora.names):
                    job.emit(aborted())  # its generation ended before it started: never on another adapter
                else:
                    active.append(job)
            case LoadAdapter(spec, name, done):
                done(self._load(spec, name))
            case DropAdapter(name):
                # no admitted generation runs on it: a job still here was left by its reader
                for a in [a for a in active if a.adapter == name]:
                    a.emit(aborted())
                    active.remove(a)
                if self._lora is not None:
                    self._lora.drop(name)

    def _load(self, spec: AdapterSpec, name: str) -> BaseException | None:
        if self._lora is None:
            return AdapterUnusable(f"{self.name} engine: started without adapters")
        try:
            self._lora.add(spec, name)
        except BaseException as exc:
            return exc
        return None

    @torch.no_grad()
    def _step(self, a: _Active) -> bool:
        s = a.request.sampling
        if self._lora is not None:
            self._lora.activate(a.adapter)
        if a.cache is None:
            ids = torch.tensor([a.request.prompt_ids], dtype=torch.long)
            out = self.model(input_ids=ids, use_cache=True)
            a.position = ids.shape[1]
        else:
            out = self.model(input_ids=a.next_input, past_key_values=a.cache, use_cache=True)
            a.position += 1
        a.cache = out.past_key_values
        logits = out.logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        token = _sample(logits, s.temperature, s.top_p, a.generator)
        a.produced += 1
        a.next_input = torch.tensor([[token]], dtype=torch.long)
        top = None
        if s.top_logprobs:
            values, idx = torch.topk(logprobs, s.top_logprobs)
            top = [[(int(i), float(v)) for i, v in zip(idx, values)]]
        finish = None
        if token in a.stop:
            finish = "stop"
        elif a.produced >= s.max_tokens or a.position + 1 >= self.max_model_len:
            finish = "length"
        a.emit(TokenDelta([token], [float(logprobs[token])], top, finish))
        return finish is not None


def _by_adapter(a: _Active) -> tuple[bool, str]:
    return a.adapter is not None, a.adapter or ""


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        keep[0] = True
        filtered = torch.zeros_like(probs)
        filtered[order[keep]] = sorted_probs[keep]
        probs = filtered / filtered.sum()
    return int(torch.multinomial(probs, 1, generator=generator))
