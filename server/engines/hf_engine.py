"""The `hf` backend: plain transformers, no extra install, CPU or GPU.

One worker thread owns the model. It interleaves the active requests one decode step each (with a KV
cache per request), so concurrent streams all progress; behavior logprobs are the raw log-softmax of
the model's logits for the sampled token. A swap drains through the gate, then copies the new state
into the model on the worker thread; a request cancelled by then (a straggler the swap ended) is
dropped with its KV cache and an "abort" delta, never stepped again.
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
from liveloop.server.engines.base import GenerationRequest, TokenDelta, aborted
from liveloop.server.engines.threaded import Emit, Stop, Submit, Swap, ThreadedEngine
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


class HFEngine(ThreadedEngine):
    name = "hf"
    thread_name = "liveloop-hf-engine"

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.model: Any = None

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=_DTYPES[self.config.dtype], trust_remote_code=self.config.trust_remote_code
        )
        self.model.eval()
        if weights_path:
            load_state(self.model, self._read_checkpoint(Path(weights_path)))
        self._start_worker(version)

    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> _Active:
        return _Active(request, emit, generator, cancelled, stop=set(request.sampling.stop_token_ids))

    def _weights_module(self) -> torch.nn.Module:
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
                match message:
                    case Stop():
                        return
                    case Swap():
                        # the gate admits no request while a swap is pending, and the ones it ended
                        # are cancelled; either way no old KV cache is continued by new weights
                        for a in active:
                            a.emit(aborted())
                        active.clear()
                        self._swap(message)
                    case Submit(job):
                        active.append(job)
            for a in list(active):
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

    @torch.no_grad()
    def _step(self, a: _Active) -> bool:
        s = a.request.sampling
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
