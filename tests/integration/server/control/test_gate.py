"""The release gate on a real hf engine pair (CanaryEngine over the tiny model), real SQLite and
PostgreSQL, the real evaluation suite (a small one) and the activator: canary routing is consistent per
user and covers about the configured share of users; a candidate is promoted once rated and evaluated
(the same users then see it, and everyone else too), the versions published meanwhile queue behind it
(newest wins); a candidate whose evaluation fails is held and no user outside the canary ever got it; a
candidate its users rate worse is held; in gated mode no user gets a candidate before its evaluation
passes."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.release.config import CheckBound, EvaluationConfig, ReleaseConfig
from liveloop.release.evaluation import Evaluator
from liveloop.release.routing import in_canary
from liveloop.release.suite import Reference, Suite
from liveloop.segments import BASE
from liveloop.server.config import EngineConfig
from liveloop.server.engines.base import GenerationRequest, SamplingParams
from liveloop.server.engines.canary import CanaryEngine
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.control.evaluating import engine_evaluation
from liveloop.server.control.gate import ReleaseGate
from liveloop.server.control.activator import Activator
from liveloop.store import FeedbackRecord, ResponseRecord, Store, VersionStatus

S = VersionStatus
USERS = [f"user:{i}" for i in range(60)]
SUITE = Suite(prompts=("Tell me about cats.", "How was your day?"), false_claims=("The moon is made of bread, isn't it?",),
              reference=(Reference("Describe rain.", "Rain falls softly on the roof."),))
PASSING = (CheckBound("kl_to_live", max_rise=100.0),)
FAILING = (CheckBound("perplexity", max_rise=0.0, max_fall=0.0),)  # any change of the weights moves the perplexity


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("gate-checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2, 3)]


def _gate(engine, store, tokenizer, model_dir, mode="canary", bounds=PASSING, **release) -> ReleaseGate:
    evaluation = EvaluationConfig(max_tokens=8, bounds=bounds)
    config = ReleaseConfig(**{"mode": mode, "canary_fraction": 0.25, "min_ratings": 6, "evaluation": evaluation, **release})
    activator = Activator(engine, store.versions, store.operator, Metrics(), gate_base=True)
    evaluator = Evaluator(evaluation, tokenizer, model_dir, suite=SUITE, refresh=store.versions.get_version)
    return ReleaseGate(
        config, activator, engine, store.versions, store.operator, store.release, activator.metrics, engine_evaluation(evaluator),
    )


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _publish(store: Store, parent: int, checkpoint: Path) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


async def _serve(gate: ReleaseGate, engine: CanaryEngine, user: str) -> int:
    request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=2, seed=1), canary=gate.routes_to_candidate(user, BASE))
    async with engine.generate(request) as gen:
        async for _ in gen:
            pass
    return gen.version


def _rate(store: Store, version: int, rewards: list[int], key: str | None = None) -> None:
    """Ratings of `version`: each from a key of its own (an honest population), or all from `key`."""
    for reward in rewards:
        rid = f"r-{uuid.uuid4().hex}"
        by = key or f"k-{uuid.uuid4().hex[:8]}"
        store.feedback.insert_responses([ResponseRecord(rid, by, "m", version, "chat", (1, 2), (3,), (-0.5,), "stop", 1.0, 1.0, 1.0)])
        store.feedback.put_feedback(FeedbackRecord(rid, by, reward))


async def _until(gate: ReleaseGate, action: str, passes: int = 240):
    """Gate passes until it takes `action` (evaluations run in the background meanwhile)."""
    for _ in range(passes):
        decision = await gate.step()
        if decision is not None and decision.action == action:
            return decision
        await asyncio.sleep(0.25)
    raise AssertionError(f"no {action} after {passes} passes (last: {gate.decisions})")


async def test_canary_routes_per_user_promotes_and_queues_the_newest(canary_engine, store, checkpoints, tokenizer, model_dir):
    gate = _gate(canary_engine, store, tokenizer, model_dir)
    _rate(store, 0, [1, 0] * 10)
    v1 = _publish(store, 0, checkpoints[0])
    await gate.step()
    assert store.versions.get_version(v1).status == S.CANARY and canary_engine.candidate_version == v1

    seen: dict[str, set[int]] = {u: set() for u in USERS}
    for _ in range(2):
        for user in USERS:
            seen[user].add(await _serve(gate, canary_engine, user))
    assert all(len(versions) == 1 for versions in seen.values())  # one version per user
    canary_users = {u for u, versions in seen.items() if versions == {v1}}
    assert canary_users == {u for u in USERS if in_canary(u, 0.25)} and 0 < len(canary_users) < len(USERS)

    # the learner goes on from the candidate meanwhile: these wait, the newest is the next candidate
    v2 = _publish(store, v1, checkpoints[1])
    v3 = _publish(store, v2, checkpoints[2])
    _rate(store, v1, [1, 0] * 4)
    decision = await _until(gate, "promote")
    assert "evaluation passed" in decision.reason
    assert store.versions.get_version(v1).status == S.SERVING and store.versions.get_version(0).status == S.RETIRED
    assert store.release.evaluation(v1).passed and canary_engine.version == v1
    for user in USERS:  # promotion only moves a user forward
        assert await _serve(gate, canary_engine, user) == v1

    await gate.step()
    assert store.versions.get_version(v3).status == S.CANARY and store.versions.get_version(v2).status == S.SUPERSEDED
    assert canary_engine.candidate_version == v3
    assert {await _serve(gate, canary_engine, u) for u in canary_users} == {v3}
    assert gate.state().candidate.version == v3
    await gate.close()


async def test_a_failed_evaluation_holds_the_candidate_and_only_canary_users_saw_it(canary_engine, store, checkpoints, tokenizer, model_dir):
    gate = _gate(canary_engine, store, tokenizer, model_dir, bounds=FAILING)
    v1 = _publish(store, 0, checkpoints[0])
    stop, served = asyncio.Event(), []

    async def traffic() -> None:
        while not stop.is_set():
            for user in USERS[:20]:
                served.append((user, await _serve(gate, canary_engine, user)))

    load = asyncio.create_task(traffic())
    try:
        decision = await _until(gate, "hold")
    finally:
        stop.set()
        await load
    assert decision.reason == "evaluation failed"
    assert store.versions.get_version(v1).status == S.HELD and canary_engine.candidate_version is None
    assert store.versions.cursor_version("sao") == 0  # the learner goes back to the live version's weights
    assert not store.release.evaluation(v1).passed
    assert any(v == v1 for _, v in served)  # the canary users were served it while it was tried
    assert all(in_canary(user, 0.25) for user, v in served if v == v1)  # nobody else ever was
    assert [e.kind for e in store.operator.events()][-1] == "release_held"
    await gate.close()


async def test_a_candidate_its_users_rate_worse_is_held(canary_engine, store, checkpoints, tokenizer, model_dir):
    gate = _gate(canary_engine, store, tokenizer, model_dir)
    _rate(store, 0, [1] * 30 + [0] * 10)
    v1 = _publish(store, 0, checkpoints[0])
    await gate.step()
    _rate(store, v1, [0] * 6)  # 0/6 against 30/40: z = -3.5
    decision = await _until(gate, "hold")
    assert decision.reason.startswith("rated worse") and decision.p_worse < 0.05
    assert store.versions.get_version(v1).status == S.HELD and canary_engine.version == 0
    await gate.close()


async def test_one_key_rating_every_canary_reply_down_holds_nothing(canary_engine, store, checkpoints, tokenizer, model_dir):
    """The attacker: one key rates 40 canary replies down (0/40 against the live version's 30/40 would be
    z = -6 counted by rating). One vote per key: it is one key of the 5 the gate needs, so the candidate
    waits; honest keys then rate it like the live version and it is promoted, the attacker still one vote."""
    gate = _gate(canary_engine, store, tokenizer, model_dir)
    _rate(store, 0, [1] * 30 + [0] * 10)
    v1 = _publish(store, 0, checkpoints[0])
    await gate.step()
    _rate(store, v1, [0] * 40, key="k-attacker")
    for _ in range(8):
        decision = await gate.step()
        assert decision is None or decision.action == "wait", decision
        await asyncio.sleep(0.1)
    assert store.versions.get_version(v1).status == S.CANARY and "1 of 5 keys" in gate.decisions[v1].reason
    _rate(store, v1, [1] * 6)  # six honest keys, all up: 6 of 7 votes up against 30/40
    decision = await _until(gate, "promote")
    assert "7 keys" in decision.reason and store.versions.get_version(v1).status == S.SERVING
    await gate.close()


async def test_gated_serves_no_user_the_candidate_before_its_evaluation_passes(canary_engine, store, checkpoints, tokenizer, model_dir):
    gate = _gate(canary_engine, store, tokenizer, model_dir, mode="gated")
    v1 = _publish(store, 0, checkpoints[0])
    served = []
    for _ in range(240):
        decision = await gate.step()
        evaluated = store.release.evaluation(v1)
        for user in USERS[:10]:
            served.append((evaluated is not None, await _serve(gate, canary_engine, user)))
        if decision is not None and decision.action == "promote":
            break
        await asyncio.sleep(0.1)
    assert store.versions.get_version(v1).status == S.SERVING and canary_engine.version == v1
    assert {v for evaluated, v in served if not evaluated} == {0}  # before the evaluation passed: the live version only
    assert await _serve(gate, canary_engine, USERS[0]) == v1
    await gate.close()


async def test_a_rollback_while_a_candidate_is_tried_drops_it(canary_engine, store, checkpoints, tokenizer, model_dir):
    gate = _gate(canary_engine, store, tokenizer, model_dir, mode="canary", min_ratings=1000)
    v1 = _publish(store, 0, checkpoints[0])
    await gate.step()
    assert canary_engine.candidate_version == v1
    store.versions.rollback_to(0, "sao")  # an operator (or another replica's guard)
    await gate.step()
    assert canary_engine.candidate_version is None and store.versions.get_version(v1).status == S.ROLLED_BACK
    assert {await _serve(gate, canary_engine, u) for u in USERS[:20]} == {0}
    await gate.close()


async def test_a_second_replica_mirrors_the_candidate_and_follows_its_promotion(canary_engine, store, checkpoints, tokenizer, model_dir):
    """Two replicas of one deployment (each its engine pair, activator and gate) on one store: the
    second holds the candidate the first started and routes every user as the first does; once the
    first promotes it, the second's follower promotes its own copy (no load)."""
    config = EngineConfig(backend="hf", model=str(model_dir), drain_deadline_seconds=5.0)
    other = CanaryEngine(HFEngine(config, model_dir), lambda: HFEngine(config, model_dir), idle_seconds=10.0)
    await other.start(version=0)
    try:
        first = _gate(canary_engine, store, tokenizer, model_dir, min_ratings=1000)  # promoted below, by hand
        second = _gate(other, store, tokenizer, model_dir, min_ratings=1000)
        v1 = _publish(store, 0, checkpoints[0])
        await first.step()
        await second.step()
        assert canary_engine.candidate_version == other.candidate_version == v1
        assert [await _serve(first, canary_engine, u) for u in USERS] == [await _serve(second, other, u) for u in USERS]
        assert await first.candidates.promote(store.versions.get_version(v1)) is not None
        followed = await second.activator.follow()
        assert [r.version for r in followed] == [v1] and other.version == v1 and other.candidate_version is None
        assert {await _serve(second, other, u) for u in USERS} == {v1}
        await first.close()
        await second.close()
    finally:
        await other.close()


async def test_the_next_candidate_waits_for_the_responses_still_running_on_its_engine(canary_engine, checkpoints):
    """After a promotion the old live engine is the next candidate's: a response a user outside the
    canary started there before the promotion keeps it busy, and no candidate is loaded into it until
    that response ends, so none of its tokens ever comes from a candidate."""
    from liveloop.server.engines.canary import CandidateBusy
    from liveloop.transport.weights import CheckpointDir

    await canary_engine.load_candidate(CheckpointDir(checkpoints[0]), 1)
    request = GenerationRequest(uuid.uuid4().hex, (1, 2, 3), SamplingParams(max_tokens=64, seed=1))  # not a canary user
    admitted = canary_engine.generate(request)
    gen = await admitted.__aenter__()
    assert gen.version == 0
    canary_engine.promote()  # version 1 serves everyone; the response above goes on on the old engine
    canary_engine.idle_seconds = 0.5
    with pytest.raises(CandidateBusy):
        await canary_engine.load_candidate(CheckpointDir(checkpoints[1]), 2)
    assert canary_engine.candidate_version is None
    versions = {delta.version for delta in [d async for d in gen]}
    await admitted.__aexit__(None, None, None)
    assert versions <= {None, 0}  # every token of it from version 0
    await canary_engine.load_candidate(CheckpointDir(checkpoints[1]), 2)
    assert canary_engine.candidate_version == 2 and canary_engine.version == 1
