"""A transformers scorer for the evaluation, off the serving engine and off the event loop: token
log-probabilities of given (prompt, completion) token ids under a version's checkpoint directory (or the
base model's), and seeded sampling from one (how the base model's own replies are drawn: no engine
serves it once a learner's version does).

A version is its checkpoint directory: a full `save_pretrained` policy, or a peft LoRA adapter
directory (a segment's version), loaded over the base model and merged. Models are kept in a small LRU
(`capacity`, 3 by default: the base, the live version and a candidate), so the base and the live
version are loaded once across the candidates that follow each other. The blocking work runs in a
worker thread (`asyncio.to_thread`); one lock serialises it. On a GPU deployment the scorer holds its
own copies of up to `capacity` models on `device` beside the engine's: size `capacity` for the memory
left (docs/design.md, "The release gate")."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from liveloop.checkpoint import PRETRAINED_LOCK

ADAPTER_CONFIG = "adapter_config.json"
VERSION_KEY = "version:"  # the LRU key of a version loaded from its verified copy


def version_key(version: int) -> str:
    return f"{VERSION_KEY}{version}"


@dataclass(frozen=True)
class Sample:
    """One sampled reply: its token ids and each token's log-probability under the model that drew it
    (log-softmax of the logits, before temperature: what the engines report)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class Scorer:
    def __init__(self, base_model_dir: str | Path, device: str = "cpu", capacity: int = 3, batch_size: int = 16):
        if capacity < 1 or batch_size < 1:
            raise ValueError("capacity and batch_size must be >= 1")
        self.base_model_dir = Path(base_model_dir)
        self.device = torch.device(device)
        self.capacity = capacity
        self.batch_size = batch_size
        self._models: OrderedDict[str, torch.nn.Module] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # models loaded from disk so far (the cache's misses)

    # -- models -------------------------------------------------------------------------------------

    def _load(self, path: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        with PRETRAINED_LOCK:  # the engines of this process may be loading too (liveloop/checkpoint.py)
            if (path / ADAPTER_CONFIG).is_file():
                from peft import PeftModel

                base = AutoModelForCausalLM.from_pretrained(str(self.base_model_dir), dtype=torch.float32)
                model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
            else:
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.loads += 1
        return model.to(self.device).eval()

    def load(self, key: str, path: Path) -> None:
        """Load the model at `path` into the LRU as `key` (a version: `version_key`), unless it is there.
        `path` is a version's verified private copy, which the caller removes once this returns: a
        version's model is only ever loaded this way, from the bytes that were verified."""
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return
            self._put(key, self._load(path))

    def loaded(self, key: str) -> bool:
        return key in self._models

    def model(self, path: str | Path | None) -> torch.nn.Module:
        """The model of a checkpoint directory (None: the base model) or of a version `load`ed as
        `version_key(v)`, from the LRU or (a directory) loaded into it. A version no longer in the LRU
        is not read again from anywhere: LookupError (load it again from a verified copy)."""
        if isinstance(path, str) and path.startswith(VERSION_KEY):
            if path not in self._models:
                raise LookupError(f"{path} is not loaded: a version is loaded from its verified copy (`Scorer.load`)")
            self._models.move_to_end(path)
            return self._models[path]
        key = str(Path(path if path is not None else self.base_model_dir).resolve())
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        return self._put(key, self._load(Path(key)))

    def _put(self, key: str, model: torch.nn.Module) -> torch.nn.Module:
        self._models[key] = model
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)
        return model

    # -- scoring ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def logprobs(self, path: str | Path | None, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Per pair, the log-probability of each completion token given the prompt and the completion
        before it, under the model at `path` (None: the base model). Batched, right-padded."""
        with self._lock:
            model = self.model(path)
            out: list[list[float]] = []
            for start in range(0, len(pairs), self.batch_size):
                out += self._batch(model, pairs[start : start + self.batch_size])
            return out

    def _batch(self, model: torch.nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        seqs = [list(p) + list(c) for p, c in pairs]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        logits = model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        nxt = torch.gather(logp, 2, ids[:, 1:].to(self.device).unsqueeze(-1)).squeeze(-1).cpu()
        out = []
        for i, (p, c) in enumerate(pairs):
            first = len(p) - 1  # the position that predicts the completion's first token
            out.append(nxt[i, first : first + len(c)].tolist())
        return out

    @torch.inference_mode()
    def sample(
        self, path: str | Path | None, prompt_ids: Sequence[int], max_tokens: int, temperature: float, seed: int,
        stop_token_ids: Sequence[int] = (),
    ) -> Sample:
        """A reply drawn from the model at `path` (None: the base model) with its own seeded generator:
        temperature sampling, top_p 1, up to `max_tokens`, ending at a stop token (kept, as the engines do)."""
        with self._lock:
            model = self.model(path)
            generator = torch.Generator().manual_seed(seed)
            ids = torch.tensor([list(prompt_ids)], device=self.device)
            past, tokens, lps = None, [], []
            for _ in range(max_tokens):
                out = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float().cpu()
                logp = torch.log_softmax(logits, dim=-1)
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
                tokens.append(token)
                lps.append(float(logp[token]))
                if token in stop_token_ids:
                    break
                ids = torch.tensor([[token]], device=self.device)
            return Sample(tuple(tokens), tuple(lps))

    @torch.inference_mode()
    def sample_batch(
        self, path: str | Path | None, prompts: Sequence[Sequence[int]], max_tokens: int, temperature: float, seeds: Sequence[int],
        stop_token_ids: Sequence[int] = (),
    ) -> list[Sample]:
        """`sample` for many prompts at once (left-padded, one KV cache, `batch_size` rows at a time),
        each row with its own seeded generator."""
        if len(prompts) != len(seeds):
            raise ValueError(f"sample_batch: {len(prompts)} prompts, {len(seeds)} seeds")
        with self._lock:
            model = self.model(path)
            out: list[Sample] = []
            for start in range(0, len(prompts), self.batch_size):
                end = start + self.batch_size
                out += self._sample_rows(model, prompts[start:end], max_tokens, temperature, seeds[start:end], stop_token_ids)
            return out

    def _sample_rows(self, model, prompts, max_tokens, temperature, seeds, stop_token_ids) -> list[Sample]:
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p))
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        tokens: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True)
        for _ in range(max_tokens):
            logits = out.logits[:, -1].float().cpu()
            logp = torch.log_softmax(logits, dim=-1)
            probs = torch.softmax(logits / temperature, dim=-1)
            step = []
            for i, g in enumerate(generators):
                token = 0
                if not done[i]:
                    token = int(torch.multinomial(probs[i], 1, generator=g))
                    tokens[i].append(token)
                    lps[i].append(float(logp[i, token]))
                    done[i] = token in stop_token_ids or len(tokens[i]) >= max_tokens
                step.append(token)
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype, device=self.device)], dim=1)
            position = position[:, -1:] + 1
            out = model(input_ids=torch.tensor(step, device=self.device)[:, None], attention_mask=mask, position_ids=position,
                        past_key_values=out.past_key_values, use_cache=True)
        return [Sample(tuple(t), tuple(lp)) for t, lp in zip(tokens, lps)]

    async def alogprobs(self, path: str | Path | None, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        return await asyncio.to_thread(self.logprobs, path, pairs)

    async def asample(self, path: str | Path | None, prompt_ids: Sequence[int], max_tokens: int, temperature: float, seed: int,
                      stop_token_ids: Sequence[int] = ()) -> Sample:
        return await asyncio.to_thread(self.sample, path, prompt_ids, max_tokens, temperature, seed, stop_token_ids)

    async def asample_batch(self, path: str | Path | None, prompts: Sequence[Sequence[int]], max_tokens: int, temperature: float,
                            seeds: Sequence[int], stop_token_ids: Sequence[int] = ()) -> list[Sample]:
        return await asyncio.to_thread(self.sample_batch, path, prompts, max_tokens, temperature, seeds, stop_token_ids)
