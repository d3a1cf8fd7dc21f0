"""The `hf` backend: plain transformers, no extra install, CPU or GPU (`engine.device`).

One worker thread owns the model and runs a batched decode loop (hf/batch.py): all running requests
advance together, one forward per step with one left-padded KV cache, and requests join and leave at
every step (at most `engine.max_num_seqs` rows run; the rest wait in arrival order). Sampling happens
on the CPU with each request's own seeded generator, in vLLM's order: the grammar's mask (constrained
rows walk their grammar, liveloop.grammar), the penalties (`_shaped`), then the temperature and the
min-p/top-k/top-p cuts (liveloop.sampling `draw_logits`); the token is drawn from that distribution and
its behaviour logprob is that distribution's (`logprobs_of = "sampled"`).

Swaps (`engine.swap_mode`): drain drops every job still held (the stragglers: "abort") and copies;
keep moves every running row back to the waiting queue so its next step re-prefills under the new
weights, each delta naming the version that sampled it. LoRA adapters (`engine.max_adapters > 0`,
hf/lora.py): rows are batched per adapter, one forward per adapter group per step, and a full-weight
swap keeps the adapters. The whole story: docs/engines.md, "The hf engine".
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from liveloop.server.config import EngineConfig
from liveloop.server.engines.adapters import AdapterSpec
from liveloop.server.engines.base import AdapterUnusable, GenerationRequest, SamplingParams, TokenDelta, aborted
from liveloop.server.engines.hf.batch import Batch, Row, decode, merge, prefill
from liveloop.server.engines.hf.lora import BaseWeights, LoraSlots
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
from liveloop.checkpoint import PRETRAINED_LOCK
from liveloop.grammar import ConstraintViolated, GrammarDeadEnd, Grammars, InvalidConstraint, Walk, grammars_for
from liveloop.sampling import GREEDY_BELOW, NO_CHANCE, draw_logits
from liveloop.transport.weights import load_state

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def engine_device(config: EngineConfig) -> torch.device:
    """Where the hf engine's model runs: `engine.device`, auto meaning cuda when present."""
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


class HFEngine(ThreadedEngine):
    name = "hf"
    thread_name = "liveloop-hf-engine"
    keeps_generations = True
    supports_constraints = True
    sampling_extensions = frozenset({"top_k", "min_p", "repetition_penalty", "min_tokens"})
    logprobs_of = "sampled"

    def __init__(self, config: EngineConfig, model_path: str | Path):
        super().__init__(config, model_path)
        self.model: Any = None
        self.device = engine_device(config)
        self.supports_adapters = config.max_adapters > 0
        self._lora: LoraSlots | None = None  # the worker thread's; set at start when adapters are on
        # the worker thread's: running batches by adapter (None: base), and rows waiting for a prefill
        self._batches: dict[str | None, Batch] = {}
        self._waiting: list[Row] = []
        self._grammars: Grammars | None = None  # the model's tokenizer's, made at the first constrained row

    async def start(self, version: int = 0, weights_path: str | Path | None = None) -> None:
        from transformers import AutoModelForCausalLM

        def load() -> Any:
            with PRETRAINED_LOCK:  # another engine of this process (the release gate's) may be loading
                return AutoModelForCausalLM.from_pretrained(
                    self.model_path, dtype=_DTYPES[self.config.dtype], trust_remote_code=self.config.trust_remote_code
                ).to(self.device)

        # off the event loop: the release gate starts its candidate engine while the server serves
        self.model = await asyncio.to_thread(load)
        self.model.eval()
        if weights_path:
            load_state(self.model, self._read_checkpoint(Path(weights_path)))
        if self.supports_adapters:
            self._lora = LoraSlots(self.model)
        self._start_worker(version)

    def _job(self, request: GenerationRequest, emit: Emit, generator: torch.Generator, cancelled: threading.Event) -> Row:
        return Row(request, emit, generator, cancelled)

    def _weights_module(self) -> HasState:
        if self._lora is not None and self._lora.wrapped:
            return BaseWeights(self.model)
        return self.model

    def _read_checkpoint(self, path: Path) -> Mapping[str, torch.Tensor]:
        # through transformers' own loader: checkpoints on disk may use another layout (e.g. MoE
        # experts saved one by one, fused in memory), which from_pretrained converts
        from transformers import AutoModelForCausalLM

        with PRETRAINED_LOCK:
            return AutoModelForCausalLM.from_pretrained(
                str(path), dtype=next(self.model.parameters()).dtype, trust_remote_code=self.config.trust_remote_code
            ).state_dict()

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(1)
        while not self._closing.is_set():
            block = not self._batches and not self._waiting
            if block:
                self._hand_over_carried()
            while True:
                try:
                    message = self._inbox.get(block=block)
                except queue.Empty:
                    break
                block = False
                if isinstance(message, Stop):
                    return
                with self._one_handover():
                    self._handle(message)
            with self._one_handover():  # a step's tokens for every row reach the event loop at once
                self._drop_cancelled()
                self._step()

    def _rows(self) -> list[Row]:
        return [r for b in self._batches.values() for r in b.rows] + self._waiting

    def _handle(self, message: Swap | Submit | LoadAdapter | DropAdapter) -> None:
        match message:
            case Swap(keep=True):
                if self._swap(message):
                    # their KV came from the old weights: recompute it (running rows first in line)
                    self._waiting = [r for b in self._batches.values() for r in b.rows] + self._waiting
                    self._batches.clear()
            case Swap():
                # the gate drained: what is left are stragglers the swap ended (or rows whose reader
                # left); no old KV cache is continued by new weights
                self._end(self._rows())
                self._swap(message)
            case Submit(job, adapter):
                job.adapter = adapter
                if adapter is not None and (self._lora is None or adapter not in self._lora.names):
                    job.emit(aborted())  # its generation ended before it started: never on another adapter
                else:
                    self._waiting.append(job)
            case LoadAdapter(spec, name, done):
                done(self._load(spec, name))
            case DropAdapter(name):
                # no admitted generation runs on it: a job still here was left by its reader
                self._end([r for r in self._rows() if r.adapter == name])
                if self._lora is not None:
                    self._lora.drop(name)

    def _end(self, rows: list[Row]) -> None:
        """Drop `rows` from the engine, each stream ending with an "abort" delta."""
        for r in rows:
            r.emit(aborted())  # nobody reads it if the client went away; a preempted stream ends
        self._remove(set(rows))

    def _remove(self, rows: set[Row]) -> None:
        self._waiting = [r for r in self._waiting if r not in rows]
        for adapter, batch in list(self._batches.items()):
            keep = [i for i, r in enumerate(batch.rows) if r not in rows]
            if not keep:
                del self._batches[adapter]
            elif len(keep) < len(batch.rows):
                self._batches[adapter] = batch.select(keep)

    def _drop_cancelled(self) -> None:
        cancelled = [r for r in self._rows() if r.cancelled.is_set()]
        if cancelled:
            self._end(cancelled)

    def _load(self, spec: AdapterSpec, name: str) -> BaseException | None:
        if self._lora is None:
            return AdapterUnusable(f"{self.name} engine: started without adapters")
        try:
            self._lora.add(spec, name)
        except BaseException as exc:
            return exc
        return None

    def _step(self) -> None:
        """One token for every running row, and the first token for waiting rows there is room for."""
        room = self.config.max_num_seqs - sum(len(b.rows) for b in self._batches.values())
        joining, self._waiting = self._waiting[: max(room, 0)], self._waiting[max(room, 0) :]
        groups = set(self._batches) | {r.adapter for r in joining}
        for adapter in sorted(groups, key=lambda a: (a is not None, a or "")):
            running = self._batches.pop(adapter, None)
            new = [r for r in joining if r.adapter == adapter]
            try:
                batch = self._advance(adapter, running, new)
            except BaseException as exc:  # report to the group's requests, keep serving the others
                for r in (running.rows if running else []) + new:
                    r.emit(exc)
                continue
            if batch is not None:
                self._batches[adapter] = batch

    @torch.no_grad()
    def _advance(self, adapter: str | None, running: Batch | None, new: list[Row]) -> Batch | None:
        """One forward for the group's running batch, one prefill for its new rows; sample, emit, and
        return the group's batch without the rows that finished (None: none left)."""
        if self._lora is not None:
            self._lora.activate(adapter)
        parts: list[tuple[Batch, torch.Tensor]] = []
        if running is not None:
            parts.append((running, decode(self.model, running)))
        if new:
            parts.append(prefill(self.model, new))
        batch, logits = parts[0]
        if len(parts) == 2:
            batch, logits = merge(batch, parts[1][0]), torch.cat([logits, parts[1][1]], dim=0)
        finished = self._sample(batch.rows, logits)
        keep = [i for i, done in enumerate(finished) if not done]
        if not keep:
            return None
        return batch if len(keep) == len(batch.rows) else batch.select(keep)

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> list[bool]:
        """Sample each row's next token (on the CPU, with its own generator), emit it; which finished.
        A row whose grammar fails (does not compile, reaches a dead end, or refuses the token drawn)
        ends alone with that error: the others in the batch go on."""
        logits = logits.float().cpu()
        failed: dict[int, Exception] = {}
        for i, r in enumerate(rows):
            if r.request.sampling.constraint is not None:
                try:
                    walk = self._walk(r)
                    walk.mask(logits[i])
                except InvalidConstraint as exc:
                    failed[i] = exc
                    continue
                if walk.dead_end:
                    failed[i] = GrammarDeadEnd(f"the constraint allows no token after {len(r.tokens)} generated; it cannot be satisfied")
        finished = []
        for i, r in enumerate(rows):
            s = r.request.sampling
            logprobs = token = None
            if i not in failed:
                logprobs = torch.log_softmax(draw_logits(_shaped(logits[i], r)[None], s.recorded("sampled"))[0], dim=-1)
                token = _draw(logprobs, s, r.generator)
            if token is not None and r.walk is not None and not r.walk.accept(token):
                failed[i] = ConstraintViolated(f"token {token} was drawn outside the request's grammar")
            if i in failed:
                r.emit(failed[i])
                finished.append(True)
                continue
            r.tokens.append(token)
            top = None
            if s.top_logprobs:
                values, idx = torch.topk(logprobs, s.top_logprobs)
                top = [[(int(t), max(float(v), NO_CHANCE)) for t, v in zip(idx, values)]]
            finish = None
            if token in s.stop_token_ids:
                finish = "stop"
            elif len(r.tokens) >= s.max_tokens or r.length >= self.max_model_len:
                finish = "length"
            version = self._serving_version if r.adapter is None else None
            r.emit(TokenDelta([token], [float(logprobs[token])], top, finish, version))
            finished.append(finish is not None)
        return finished


    def _walk(self, row: Row) -> Walk:
        if row.walk is None:
            if self._grammars is None:
                self._grammars = grammars_for(self.model_path, self.model.config.vocab_size)
            row.walk = self._grammars.walk(row.request.sampling.constraint)
        return row.walk


def _shaped(logits: torch.Tensor, row: Row) -> torch.Tensor:
    """The logits the draw uses: stop tokens banned before `min_tokens`, the repetition penalty over
    the prompt and the output so far (vLLM's: a positive logit divided by it, a negative one times it)."""
    s = row.request.sampling
    if len(row.tokens) >= s.min_tokens and s.repetition_penalty == 1.0:
        return logits
    out = logits.clone()
    if len(row.tokens) < s.min_tokens and s.stop_token_ids:
        out[list(s.stop_token_ids)] = float("-inf")
    if s.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.request.prompt_ids) | set(row.tokens)), dtype=torch.long)
        v = out[seen]
        out[seen] = torch.where(v > 0, v / s.repetition_penalty, v * s.repetition_penalty)
    return out


def _draw(logprobs: torch.Tensor, s: SamplingParams, generator: torch.Generator) -> int:
    """Draw a token from the draw's distribution (`draw_logits`' log-softmax): greedy at temperature 0."""
    if s.temperature < GREEDY_BELOW:
        return int(torch.argmax(logprobs))
    return int(torch.multinomial(logprobs.exp(), 1, generator=generator))
