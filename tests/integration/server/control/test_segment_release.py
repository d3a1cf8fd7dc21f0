"""The release gate on a segment's adapter lineage (issue 21: modes per segment adapter), on a real hf
engine over the tiny model with peft adapters, real SQLite and PostgreSQL, the real evaluation suite (a
small one), the activator and the gate. The base lineage stays immediate (no second engine); segment
"cozy" is gated, "night" is not. A cozy candidate is a second adapter slot of the live engine: in
canary mode it serves exactly the canary users of cozy, consistently, and nobody else (other
segments, base requests); promotion makes it every cozy user's adapter with no load; a held one is
unloaded and cozy's learner lane is pointed back at the live adapter; in gated mode nobody is served it
before its evaluation passes. A second replica holding the same candidate follows a promotion without
a load."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from liveloop.devtools import random_lora_adapter
from liveloop.metrics import Metrics
from liveloop.release.config import CheckBound, EvaluationConfig, ReleaseConfig
from liveloop.release.evaluation import Evaluator
from liveloop.release.routing import in_canary
from liveloop.release.suite import Reference, Suite
from liveloop.segments import Lineage
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.engines.canary import CanaryEngine, candidate_slot
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.control.evaluating import engine_evaluation
from liveloop.server.control.gate import ReleaseGate
from liveloop.server.control.activator import Activator
from liveloop.server.edge.admin.release import release_json
from liveloop.store import FeedbackRecord, ResponseRecord, Store, VersionStatus

S = VersionStatus
USERS = [f"user:{i}" for i in range(32)]
FRACTION = 0.25
SUITE = Suite(prompts=("Tell me about cats.", "How was your day?"), false_claims=("The moon is made of bread, isn't it?",),
              reference=(Reference("Describe rain.", "Rain falls softly on the roof."),))
PASSING = (CheckBound("kl_to_live", max_rise=100.0),)
FAILING = (CheckBound("perplexity", max_rise=0.0, max_fall=0.0),)  # any change of the adapter moves the perplexity
SEGMENTS = ("cozy", "night")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("segment-release-adapters")
    return [random_lora_adapter(model_dir, root / f"a{seed}", seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _engine(model_dir: Path) -> CanaryEngine:
    config = EngineConfig(backend="hf", model=str(model_dir), drain_deadline_seconds=5.0, max_adapters=8, max_lora_rank=4)
    return CanaryEngine(HFEngine(config, model_dir), lambda: HFEngine(config, model_dir), idle_seconds=10.0)


@pytest.fixture
async def engine(model_dir):
    engine = _engine(model_dir)
    await engine.start(version=0)
    yield engine
    await engine.close()


def _gate(engine, store, tokenizer, model_dir, cozy="canary", bounds=PASSING, min_ratings=6) -> ReleaseGate:
    evaluation = EvaluationConfig(max_tokens=8, bounds=bounds)
    config = ReleaseConfig(mode="immediate", segments={"cozy": cozy}, canary_fraction=FRACTION, min_ratings=min_ratings, evaluation=evaluation)
    activator = Activator(engine, store.versions, store.operator, Metrics(), segments=SEGMENTS)
    evaluator = Evaluator(evaluation, tokenizer, model_dir, suite=SUITE, refresh=store.versions.get_version)
    return ReleaseGate(
        config, activator, engine, store.versions, store.operator, store.release, activator.metrics, engine_evaluation(evaluator),
    )


def _publish(store: Store, parent: int, adapter: Path, segment: str = "cozy") -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(adapter), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name=f"sao:{segment}", last_feedback_id=0, segment=segment,
    ).version


async def _live_cozy(gate: ReleaseGate, store: Store, adapter: Path) -> int:
    """Cozy's first adapter, serving (activated as an operator's setup: the gate starts after it)."""
    v1 = _publish(store, 0, adapter)
    assert await gate.activator.activate(store.versions.get_version(v1)) is not None
    assert store.versions.get_version(v1).status == S.SERVING and gate.engine.adapter_version("cozy") == v1
    return v1


async def _serve(gate: ReleaseGate, engine: CanaryEngine, user: str, segment: str | None) -> tuple[int, bool]:
    request = GenerationRequest(
        uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=2, seed=1), lineage=Lineage(segment), canary=gate.routes_to_candidate(user, Lineage(segment)),
    )
    async with engine.generate(request) as gen:
        async for _ in gen:
            pass
    return gen.version, gen.adapter


def _rate(store: Store, version: int, rewards: list[int]) -> None:
    """Ratings of `version`, each from a key of its own (the gate counts one vote per key)."""
    for reward in rewards:
        rid, key = f"r-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex[:8]}"
        store.feedback.insert_responses([ResponseRecord(rid, key, "m", version, "chat", (1, 2), (3,), (-0.5,), "stop", 1.0, 1.0, 1.0)])
        store.feedback.put_feedback(FeedbackRecord(rid, key, reward))


async def _until(gate: ReleaseGate, version: int, action: str, passes: int = 240, each=None):
    """Gate passes until its verdict on `version` is `action` (evaluations run in the background)."""
    for _ in range(passes):
        await gate.step()
        if each is not None:
            await each()
        decision = gate.decisions.get(version)
        if decision is not None and decision.action == action:
            return decision
        await asyncio.sleep(0.25)
    raise AssertionError(f"no {action} of {version} after {passes} passes (last: {gate.decisions})")


async def test_a_segment_candidate_serves_its_canary_users_only_and_promotion_makes_it_everyones(engine, store, adapters, tokenizer, model_dir):
    gate = _gate(engine, store, tokenizer, model_dir)
    v1 = await _live_cozy(gate, store, adapters[0])
    v2 = _publish(store, v1, adapters[1])
    await gate.activator._watch_adapters()  # the watcher activates nothing of a gated segment
    assert store.versions.get_version(v2).status == S.PUBLISHED and engine.adapter_version("cozy") == v1
    await gate.step()
    assert store.versions.get_version(v2).status == S.CANARY and engine.candidate_adapter_version("cozy") == v2
    assert engine.candidate is None  # no second engine: the slot is in the live engine

    seen: dict[tuple[str, str | None], set[tuple[int, bool]]] = {}
    for user, segment in [(u, s) for u in USERS for s in ("cozy", "night", None)] + [(u, "cozy") for u in USERS]:
        seen.setdefault((user, segment), set()).add(await _serve(gate, engine, user, segment))  # cozy twice
    assert all(len(versions) == 1 for versions in seen.values())  # one version per user and segment
    canary = {u for u in USERS if in_canary(u, FRACTION)}
    assert 0 < len(canary) < len(USERS)
    assert {u for u in USERS if seen[(u, "cozy")] == {(v2, True)}} == canary  # the candidate adapter, recorded as v2
    assert all(seen[(u, "cozy")] == {(v1, True)} for u in USERS if u not in canary)
    assert all(seen[(u, s)] == {(0, False)} for u in USERS for s in ("night", None))  # never another segment's, nor base users
    state = gate.state()
    cozy = next(lineage for lineage in state.lineages if lineage.segment == "cozy")
    assert state.segment_modes == {"cozy": "canary", "night": "immediate"} and cozy.serving == v1 and cozy.candidate.version == v2
    assert cozy.candidate.loaded and state.candidate is None
    body = release_json(state, engine.version).model_dump()  # GET /admin/release
    assert body["segments"] == {"cozy": "canary", "night": "immediate"} and body["lineages"]["cozy"]["serving"] == v1
    assert body["lineages"]["cozy"]["candidate"]["version"] == v2 and body["lineages"]["cozy"]["candidate"]["loaded"]

    _rate(store, v1, [1, 0] * 10)
    _rate(store, v2, [1, 0] * 4)
    decision = await _until(gate, v2, "promote")
    assert "evaluation passed" in decision.reason and store.release.evaluation(v2).live_version == v1
    assert store.versions.get_version(v2).status == S.SERVING and store.versions.get_version(v1).status == S.RETIRED
    assert engine.adapter_version("cozy") == v2 and engine.candidate_adapter_version("cozy") is None
    assert engine.live._adapters.held == {engine.live._adapters.current("cozy").name}  # no load: the slot's adapter moved, v1's went
    assert {await _serve(gate, engine, user, "cozy") for user in USERS} == {(v2, True)}
    assert await _serve(gate, engine, USERS[0], "night") == (0, False)
    await gate.close()


async def test_a_held_segment_candidate_is_unloaded_and_its_lane_goes_back_to_the_live_adapter(engine, store, adapters, tokenizer, model_dir):
    gate = _gate(engine, store, tokenizer, model_dir, bounds=FAILING)
    v1 = await _live_cozy(gate, store, adapters[0])
    v2 = _publish(store, v1, adapters[1])
    assert store.versions.cursor_version("sao:cozy") == v2
    served: list[tuple[str, int]] = []

    async def traffic() -> None:
        for user in USERS[:12]:
            served.append((user, (await _serve(gate, engine, user, "cozy"))[0]))

    decision = await _until(gate, v2, "hold", each=traffic)
    assert decision.reason == "evaluation failed" and not store.release.evaluation(v2).passed
    assert store.versions.get_version(v2).status == S.HELD and store.versions.get_version(v1).status == S.SERVING
    assert engine.candidate_adapter_version("cozy") is None and candidate_slot("cozy") not in engine.live._adapters._current
    assert store.versions.cursor_version("sao:cozy") == v1  # cozy's learner goes on from the live adapter
    assert store.versions.cursor_version("sao") is None or store.versions.cursor_version("sao") == 0  # the base lane is not touched
    assert all(in_canary(user, FRACTION) for user, v in served if v == v2)  # nobody outside the canary got it
    assert {(await _serve(gate, engine, u, "cozy"))[0] for u in USERS} == {v1}
    events = [e for e in store.operator.events() if e.kind == "release_held"]
    assert events and events[-1].detail["segment"] == "cozy"
    await gate.close()


async def test_gated_segment_candidate_serves_nobody_until_evaluated(engine, store, adapters, tokenizer, model_dir):
    gate = _gate(engine, store, tokenizer, model_dir, cozy="gated")
    v1 = await _live_cozy(gate, store, adapters[0])
    v2 = _publish(store, v1, adapters[1])
    served: list[tuple[bool, int]] = []

    async def traffic() -> None:
        evaluated = store.release.evaluation(v2) is not None
        for user in USERS[:12]:
            served.append((evaluated, (await _serve(gate, engine, user, "cozy"))[0]))

    await _until(gate, v2, "promote", each=traffic)
    assert {v for evaluated, v in served if not evaluated} == {v1}  # before its evaluation: the live adapter only
    assert store.versions.get_version(v2).status == S.SERVING and engine.adapter_version("cozy") == v2
    assert {(await _serve(gate, engine, u, "cozy"))[0] for u in USERS[:12]} == {v2}
    await gate.close()


async def test_a_second_replica_follows_a_segment_promotion_from_its_own_slot(engine, store, adapters, tokenizer, model_dir):
    other = _engine(model_dir)
    await other.start(version=0)
    try:
        first = _gate(engine, store, tokenizer, model_dir, min_ratings=1000)  # promoted below, by hand
        second = _gate(other, store, tokenizer, model_dir, min_ratings=1000)
        v1 = await _live_cozy(first, store, adapters[0])
        await second.activator.follow()
        assert other.adapter_version("cozy") == v1
        v2 = _publish(store, v1, adapters[1])
        await first.step()
        await second.step()  # mirrors the store's candidate into its own slot
        assert other.candidate_adapter_version("cozy") == v2
        assert await first.candidates.promote(store.versions.get_version(v2)) is not None
        held = set(other.live._adapters.held)
        done = await second.activator.follow()
        assert [d.version for d in done] == [v2] and other.adapter_version("cozy") == v2
        assert other.candidate_adapter_version("cozy") is None and other.live._adapters.held <= held  # no new load
        await first.close()
        await second.close()
    finally:
        await other.close()
