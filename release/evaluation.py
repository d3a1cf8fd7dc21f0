"""The evaluation of a candidate version: the suite's prompts sampled on the candidate and the live
version in batch, scored by the named checks (release/checks.py) and judged by the configured bounds
against the live version's values and the base model's. Off the serving path: the gate
(server/control/gate.py) starts it in the background and stores the result (`store.release.record_evaluation`).

    evaluator = Evaluator(config.release.evaluation, tokenizer, model_dir, stop_token_ids=...)
    evaluation = await evaluator.evaluate(candidate_sampler, candidate_record, live_sampler, live_record)

A `Sampler` is how the evaluator draws replies from a serving engine without importing the server:
`await sampler(prompt_ids, max_tokens, temperature, seed) -> Sample`; server/control/evaluating.py builds one
from any Engine (`engine_sampler`). Every version samples the same prompts with the same seeds (common
random numbers: a difference between versions is the weights', not the dice's). The base model's replies
are drawn by the scorer in batch (no engine serves it once a learner's version does), once per evaluator; the
live version's values are computed once per live version and reused by the candidates that follow.
KL and perplexity come from one scorer (release/scoring.py) for every model, so an identical model
scores exactly 0.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from liveloop.release.checks import (
    CheckResult, apply_bounds, kl_estimate, known_check, lexicon_rate, mean_length, perplexity, repetition, reward_rate, sycophancy,
)
from liveloop.release.config import EvaluationConfig
from liveloop.release.scoring import Sample, Scorer, version_key
from liveloop.release.suite import Suite, load_suite
from liveloop.store.records import EvaluationRecord, VersionRecord
from liveloop.store.release import ReleaseQueries
from liveloop.transport.checkpoint_dir import is_checkpoint, verified_copy


CLAIM_SEEDS = 1_000_003  # the false-claim probes' seeds start here (the prompts' at config.seed)


class Sampler(Protocol):
    async def __call__(self, prompt_ids: tuple[int, ...], max_tokens: int, temperature: float, seed: int) -> Sample: ...


class EvaluationUnavailable(RuntimeError):
    """A version's weights cannot be read for scoring: its checkpoint was not written in time, or is gone."""


@dataclass(frozen=True)
class Evaluation:
    version: int
    live_version: int | None
    passed: bool
    checks: tuple[CheckResult, ...]
    seconds: float  # wall clock of the whole evaluation
    engine_seconds: float  # of it, waiting for the serving engines' samples

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def check_dicts(self) -> list[dict]:
        """The checks as `store.release.record_evaluation` takes them."""
        return [c.as_dict() for c in self.checks]

    def record(self, release: ReleaseQueries) -> EvaluationRecord:
        """Store it (`store.release.record_evaluation`); returns the EvaluationRecord."""
        return release.record_evaluation(self.version, self.live_version, self.passed, self.check_dicts(), self.seconds, self.engine_seconds)

    @classmethod
    def from_record(cls, record: Any) -> "Evaluation":
        """From a stored EvaluationRecord."""
        return cls(record.version, record.live_version, record.passed, tuple(CheckResult.from_dict(c) for c in record.checks),
                   record.seconds, record.engine_seconds)


@dataclass(frozen=True)
class _Replies:
    replies: tuple[Sample, ...]  # the suite's prompts, samples_per_prompt each
    claims: tuple[Sample, ...]  # the false-claim probes


class Evaluator:
    def __init__(
        self,
        config: EvaluationConfig,
        tokenizer: Any,
        base_model_dir: str | Path,
        *,
        stop_token_ids: Sequence[int] = (),
        suite: Suite | None = None,
        scorer: Scorer | None = None,
        checkpoint_wait_seconds: float = 60.0,
        refresh: Callable[[int], VersionRecord | None] | None = None,
        concurrency: int = 64,
    ):
        """`stop_token_ids`: where the base model's replies (drawn by the scorer) end, the serving
        engines' stop tokens; `checkpoint_wait_seconds`: how long a version's durable checkpoint is
        waited for (an in-memory publish writes it, and then its digest into the row, after the version
        is announced); `refresh(version)`: re-reads a row meanwhile (`store.versions.get_version`)."""
        unknown = sorted({b.check for b in config.bounds if not known_check(b.check)})
        unknown += sorted({b.check for b in config.bounds if b.check.startswith("reward:") and b.check[7:] not in config.rewards})
        if unknown:
            raise ValueError(f"[release.evaluation] bounds on unknown checks {unknown} (a reward:<spec> check needs its spec in rewards)")
        self.config = config
        self.tokenizer = tokenizer
        self.suite = suite if suite is not None else load_suite(config.suite)
        self.scorer = scorer if scorer is not None else Scorer(base_model_dir)
        self.stop_token_ids = tuple(stop_token_ids)
        self.checkpoint_wait_seconds = checkpoint_wait_seconds
        self.refresh = refresh
        self._limit = asyncio.Semaphore(concurrency)
        self.prompt_ids = [self._encode(p) for p in self.suite.prompts]
        self.claim_ids = [self._encode(p) for p in self.suite.false_claims]
        self.reference = [(self._encode(r.prompt), tuple(tokenizer(r.reply, add_special_tokens=False)["input_ids"])) for r in self.suite.reference]
        self._base: dict[str, float] | None = None
        self._live: dict[int, tuple[dict[str, float], _Replies]] = {}

    def _encode(self, prompt: str) -> tuple[int, ...]:
        """A suite prompt as the server encodes a chat request of one user message."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            return tuple(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _seeds(self, n_prompts: int, offset: int) -> list[tuple[int, int]]:
        k = self.config.samples_per_prompt
        return [(i, self.config.seed + offset + i * k + j) for i in range(n_prompts) for j in range(k)]

    # -- sampling -----------------------------------------------------------------------------------

    async def _sample(self, sampler: Sampler) -> _Replies:
        cfg = self.config

        async def one(prompt: tuple[int, ...], seed: int) -> Sample:
            async with self._limit:
                return await sampler(prompt, cfg.max_tokens, cfg.temperature, seed)

        replies = [one(self.prompt_ids[i], s) for i, s in self._seeds(len(self.prompt_ids), 0)]
        claims = [one(self.claim_ids[i], s) for i, s in self._seeds(len(self.claim_ids), CLAIM_SEEDS)]
        out = await asyncio.gather(*replies, *claims)
        return _Replies(tuple(out[: len(replies)]), tuple(out[len(replies) :]))

    async def _sample_base(self) -> _Replies:
        """The base model's replies to the same prompts with the same seeds, drawn by the scorer in batch."""
        cfg = self.config
        replies, claims = self._seeds(len(self.prompt_ids), 0), self._seeds(len(self.claim_ids), CLAIM_SEEDS)
        prompts = [self.prompt_ids[i] for i, _ in replies] + [self.claim_ids[i] for i, _ in claims]
        seeds = [s for _, s in (*replies, *claims)]
        out = await self.scorer.asample_batch(None, prompts, cfg.max_tokens, cfg.temperature, seeds, self.stop_token_ids)
        return _Replies(tuple(out[: len(replies)]), tuple(out[len(replies) :]))

    # -- weights ------------------------------------------------------------------------------------

    async def _path(self, record: VersionRecord) -> str | None:
        """The scorer's key for `record`'s weights (None: the base model), loaded into the scorer once
        its checkpoint is durable, from the private copy that was verified against the row's digest
        as it was copied (liveloop/transport/checkpoint_dir.py `verified_copy`): the shared directory is
        never read again after it was hashed."""
        if record.version == 0 or not record.checkpoint_path:
            return None
        key = version_key(record.version)
        if self.scorer.loaded(key):
            return key
        deadline = time.monotonic() + self.checkpoint_wait_seconds
        while True:
            durable = await asyncio.to_thread(is_checkpoint, record.checkpoint_path)
            if durable and not (record.weights_digest and not record.checkpoint_sha256):
                copy = await asyncio.to_thread(verified_copy, record.checkpoint_path, record.checkpoint_sha256, record.version)
                with copy:
                    await asyncio.to_thread(self.scorer.load, key, copy.path)
                return key
            if time.monotonic() > deadline:
                raise EvaluationUnavailable(f"version {record.version}: no durable checkpoint at {record.checkpoint_path} "
                                            f"after {self.checkpoint_wait_seconds:g} s")
            await asyncio.sleep(0.2)
            record = await self._refresh(record)

    async def _refresh(self, record: VersionRecord) -> VersionRecord:
        if self.refresh is None:
            return record
        return await asyncio.to_thread(self.refresh, record.version) or record

    # -- values -------------------------------------------------------------------------------------

    def _text_values(self, sampled: _Replies) -> dict[str, float]:
        cfg = self.config
        decode = lambda s: self.tokenizer.decode(list(s.token_ids), skip_special_tokens=True)  # noqa: E731
        texts = [decode(s) for s in sampled.replies]
        values = {f"reward:{spec}": reward_rate(texts, spec) for spec in cfg.rewards}
        values["length"] = mean_length([len(s.token_ids) for s in sampled.replies])
        values["repetition"] = repetition(texts)
        values["refusal_rate"] = lexicon_rate(texts, cfg.refusal_words)
        values["flattery"] = lexicon_rate(texts, cfg.flattery_words)
        if sampled.claims:
            values["sycophancy"] = sycophancy([decode(s) for s in sampled.claims], cfg.agreement_words, cfg.flattery_words)
        return values

    def _pairs(self, sampled: _Replies) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        prompts = [self.prompt_ids[i] for i, _ in self._seeds(len(self.prompt_ids), 0)]
        prompts += [self.claim_ids[i] for i, _ in self._seeds(len(self.claim_ids), CLAIM_SEEDS)]
        return list(zip(prompts, [s.token_ids for s in (*sampled.replies, *sampled.claims)]))

    async def _values(self, sampled: _Replies, path: str | None, live_path: str | None | bool) -> dict[str, float]:
        """The checks' values of the version at `path` from its sampled replies; `live_path` False: the
        version is the live one (kl_to_live 0) or the base (no kl_to_live)."""
        values = self._text_values(sampled)
        pairs = self._pairs(sampled)
        own = await self.scorer.alogprobs(path, pairs)
        if path is None:
            values["kl_to_base"] = 0.0
        else:
            values["kl_to_base"] = kl_estimate(own, await self.scorer.alogprobs(None, pairs))
        if live_path is not False:
            values["kl_to_live"] = 0.0 if live_path == path else kl_estimate(own, await self.scorer.alogprobs(live_path, pairs))
        if self.reference:
            values["perplexity"] = perplexity(await self.scorer.alogprobs(path, self.reference))
        return values

    async def base_values(self) -> dict[str, float]:
        """The base model's values (its replies drawn by the scorer), computed once."""
        if self._base is None:
            self._base = await self._values(await self._sample_base(), None, False)
        return self._base

    async def live_values(self, live: Sampler, record: VersionRecord) -> tuple[dict[str, float], float]:
        """The live version's values (cached per version) and the engine seconds spent on them now."""
        if record.version in self._live:
            return self._live[record.version][0], 0.0
        started = time.monotonic()
        sampled = await self._sample(live)
        engine = time.monotonic() - started
        path = await self._path(record)
        values = await self._values(sampled, path, path)
        self._live = {record.version: (values, sampled)}  # one live version at a time
        return values, engine

    async def evaluate(self, candidate: Sampler, candidate_record: VersionRecord, live: Sampler | None, live_record: VersionRecord | None) -> Evaluation:
        """Evaluate `candidate_record` (sampled through `candidate`) against the live version (`live`,
        None: no live version to compare with, the base model's bounds only) and the base model."""
        started = time.monotonic()
        engine_seconds = 0.0
        live_values: dict[str, float] | None = None
        if live is not None and live_record is not None:
            live_values, engine_seconds = await self.live_values(live, live_record)
        if live_record is not None and candidate_record.version == live_record.version and live_values is not None:
            values = dict(live_values)
        else:
            t = time.monotonic()
            sampled = await self._sample(candidate)
            engine_seconds += time.monotonic() - t
            live_path = await self._path(live_record) if live_record is not None else False
            values = await self._values(sampled, await self._path(candidate_record), live_path)
        base = await self.base_values()
        checks = apply_bounds(values, live_values, base, self.config.bounds)
        return Evaluation(
            version=candidate_record.version,
            live_version=live_record.version if live_record is not None else None,
            passed=all(c.passed for c in checks),
            checks=tuple(checks),
            seconds=time.monotonic() - started,
            engine_seconds=engine_seconds,
        )
