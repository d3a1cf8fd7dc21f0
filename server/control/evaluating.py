"""The release evaluation's view of a serving engine: `engine_sampler(engine, ...)` turns any Engine
into the `Sampler` the evaluator (liveloop.release.evaluation) draws replies with, so the release
component never imports the server; `engine_evaluation(evaluator, stop_token_ids)` is the gate's
`evaluate(candidate_engine, candidate, live_engine, live)` over it. The requests are ordinary generations of the engine (the hf
engine batches them with live traffic); they are not logged to the store and rate nothing. A segment's
candidate adapter is reached through its slot (a canary request of the segment on the live engine)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence

from liveloop.release.evaluation import Evaluation, Evaluator, Sampler
from liveloop.release.scoring import Sample
from liveloop.segments import BASE, Lineage
from liveloop.server.engines.base import Engine, GenerationRequest, SamplingParams
from liveloop.store.records import VersionRecord

EngineEvaluate = Callable[[Engine, VersionRecord, Engine, VersionRecord], Awaitable[Evaluation]]


def engine_sampler(engine: Engine, stop_token_ids: Sequence[int] = (), lineage: Lineage = BASE, canary: bool = False) -> Sampler:
    """A Sampler over `engine`: seeded temperature sampling up to max_tokens, ending at a stop token.
    `lineage`: the adapter slot that serves (a segment's candidate adapter); `canary`: route to the
    candidate of a canary engine (server/engines/canary.py)."""
    stops = tuple(stop_token_ids)

    async def sample(prompt_ids: tuple[int, ...], max_tokens: int, temperature: float, seed: int) -> Sample:
        request = GenerationRequest(
            request_id=f"eval-{uuid.uuid4().hex[:12]}",
            prompt_ids=tuple(prompt_ids),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, stop_token_ids=stops),
            lineage=lineage,
            canary=canary,
        )
        tokens: list[int] = []
        logprobs: list[float] = []
        async with engine.generate(request) as gen:
            async for delta in gen:
                tokens += delta.token_ids
                logprobs += delta.logprobs
        return Sample(tuple(tokens), tuple(logprobs))

    return sample


def engine_evaluation(evaluator: Evaluator, stop_token_ids: Sequence[int] = ()) -> EngineEvaluate:
    """The gate's `evaluate(candidate_engine, candidate, live_engine, live)`: the evaluator sampling each
    version through its engine. The candidate's requests are marked `canary`: a segment candidate's
    engine is the live `CanaryEngine`, which serves a canary request of the segment from the segment's
    candidate adapter slot (server/engines/canary.py); a base candidate's engine is the candidate engine
    itself, which reads no mark. The live version's requests name its segment (its live adapter; None:
    the base weights)."""

    async def evaluate(candidate_engine: Engine, candidate: VersionRecord, live_engine: Engine, live: VersionRecord) -> Evaluation:
        return await evaluator.evaluate(
            engine_sampler(candidate_engine, stop_token_ids, Lineage.of(candidate), canary=True), candidate,
            engine_sampler(live_engine, stop_token_ids, Lineage.of(live)), live,
        )

    return evaluate
