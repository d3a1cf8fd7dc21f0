"""server/control/forgetting.py: forget that reaches the weights, planned and run against real SQLite and PostgreSQL, a real hf
engine (models/liveloop-tiny) and the real activator: the plan finds the first version that trained the
key's first rating, rolls back to the newest servable version before it (passing over one whose
checkpoint retention deleted), counts everyone else's ratings to train again; a dry run changes
nothing; the forget deletes the key's rows, serves the target, marks the later versions rolled back and
moves the learner's cursor back to the target's feedback position, and a publish on the old lineage is
refused. A key rated after the last version moves the lineage back one version (the learner may hold
it in unpublished steps); a key that never rated moves nothing; a segment's adapters are planned on
their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from liveloop.checkpoint import checkpoint_digest
from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.segments import Lineage
from liveloop.server.control.forgetting import Forgetting, plan_forget
from liveloop.server.control.activator import Activator
from liveloop.store import FeedbackRecord, ResponseRecord, StaleLineage, Store, VersionStatus
from liveloop.store.rights import KeyNotFound

S = VersionStatus
PLANTED, OTHER = "a" * 16, "b" * 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("forget-checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2, 3)]


def _rate(store: Store, n: int, key: str = OTHER, segment: str | None = None) -> list[int]:
    """`n` responses of `key`, each rated once; returns the ratings' ids."""
    ids = []
    for _ in range(n):
        rid = f"r{store.feedback.counts()['responses']:04d}"
        store.feedback.insert_responses([ResponseRecord(
            id=rid, api_key_id=key, model="m", policy_version=0, endpoint="chat", prompt_ids=(1, 2, 3), response_ids=(4, 5),
            behavior_logprobs=(-0.5, -0.25), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0, segment=segment,
        )])
        ids.append(store.feedback.put_feedback(FeedbackRecord(rid, key, 1)).id)
    return ids


def _publish(store: Store, parent: int, checkpoint: Path | None, cursor: int, lane: str = "sao", segment: str | None = None) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint) if checkpoint else "/nowhere", checkpoint_sha256=checkpoint_digest(checkpoint) if checkpoint else None,
        learner_step=cursor, samples_used=4, metrics={"learner/cursor": cursor}, cursor_name=lane, last_feedback_id=cursor, segment=segment,
    ).version


def _forgetting(store: Store, activator: Activator) -> Forgetting:
    return Forgetting(activator, rights=store.rights, versions=store.versions, feedback=store.feedback, operator=store.operator)


def _history(store: Store, checkpoints: list[Path]) -> tuple[int, int, int, int]:
    """Ratings 1-12 (the planted key's is the 6th); v1 trained 1-4, v2 5-8, v3 9-12."""
    ids = _rate(store, 5) + _rate(store, 1, PLANTED) + _rate(store, 6)
    planted = ids[5]
    v1 = _publish(store, 0, checkpoints[0], ids[3])
    v2 = _publish(store, v1, checkpoints[1], ids[7])
    v3 = _publish(store, v2, checkpoints[2], ids[11])
    return v1, v2, v3, planted


async def test_a_dry_run_plans_and_changes_nothing(engine, store, checkpoints):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1, v2, v3, planted = _history(store, checkpoints)
    await activator.activate(store.versions.get_version(v3))
    statuses = {r.version: r.status for r in store.versions.list_versions()}

    result = await _forgetting(store, activator).forget(PLANTED, dry_run=True)
    (plan,) = result.plan.lineages
    assert (plan.first_rating, plan.first_trained, plan.target, plan.head) == (planted, v2, v1, v3)
    assert plan.target_cursor == store.versions.get_version(v1).metrics["learner/cursor"] and plan.affected == (v2, v3)
    assert plan.replay == 7  # ratings 5-12 but the planted key's
    assert plan.samples_per_second is not None and plan.estimate_seconds == pytest.approx(7 / plan.samples_per_second)
    assert (result.plan.responses, result.plan.ratings) == (1, 1)
    # nothing moved: rows, statuses, cursor, engine
    assert {r.version: r.status for r in store.versions.list_versions()} == statuses and engine.version == v3
    assert store.versions.cursor_version("sao") == v3 and store.feedback.get_cursor("sao") == plan.head_cursor
    assert store.rights.key_rows(PLANTED) == (1, 1) and not [e for e in store.operator.events() if e.kind == "forget_weights"]


async def test_the_forget_rolls_back_and_moves_the_learner_back(engine, store, checkpoints):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1, v2, v3, planted = _history(store, checkpoints)
    await activator.activate(store.versions.get_version(v3))
    store.versions.mark_pruned([v1])  # retention deleted v1's checkpoint: the target is the base model

    result = await _forgetting(store, activator).forget(PLANTED, dry_run=False, admin_key_id="admin")
    (plan,) = result.plan.lineages
    assert (plan.target, plan.skipped, plan.target_cursor, plan.replay) == (0, (v1,), 0, 11)
    assert result.deleted.ratings == 1 and store.rights.key_rows(PLANTED) == (0, 0)
    (done,) = result.done
    assert done.rolled_back == (v1, v2, v3) and done.swapped and done.resumed
    assert engine.version == 0 and store.versions.latest_version().version == 0
    assert {r.version: r.status for r in store.versions.list_versions() if r.version} == {v1: S.ROLLED_BACK, v2: S.ROLLED_BACK, v3: S.ROLLED_BACK}
    # the learner reloads the base and reads every rating after 0 again (the planted one is gone)
    assert (store.versions.cursor_version("sao"), store.feedback.get_cursor("sao")) == (0, 0)
    assert [f.api_key_id for f, _ in store.feedback.rated_after(0, 100)] == [OTHER] * 11
    assert not store.operator.learning_paused("sao")
    event = [e for e in store.operator.events() if e.kind == "forget_weights"][-1]
    assert event.detail["lineages"][0]["target"] == 0 and event.detail["replay"] == 11
    # a learner still on v3 is refused; its retrained version from the base goes on as the new lineage
    with pytest.raises(StaleLineage):
        _publish(store, v3, checkpoints[0], 20)
    nxt = _publish(store, 0, checkpoints[0], 4)
    assert (await activator.activate(store.versions.get_version(nxt))).version == nxt


async def test_a_forget_when_the_target_serves_already_rolls_back_the_rest(engine, store, checkpoints):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1, v2, v3, _ = _history(store, checkpoints)
    await activator.activate(store.versions.get_version(v1))  # v2 and v3 wait (e.g. a gate holds them back)
    result = await _forgetting(store, activator).forget(PLANTED, dry_run=False)
    (done,) = result.done
    assert (done.target, done.swapped, done.rolled_back) == (v1, False, (v2, v3))
    assert engine.version == v1 and store.versions.cursor_version("sao") == v1
    assert store.feedback.get_cursor("sao") == store.versions.get_version(v1).metrics["learner/cursor"]


async def test_a_key_rated_after_the_last_version_drops_the_learners_unpublished_steps(engine, store, checkpoints):
    """No version trained the late key's ratings, but the learner may hold them in steps it has not
    published: the lineage moves back one version (the cursor's version changes, so the learner reloads
    and drops them) and everyone else's ratings since are trained again."""
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1, v2, v3, _ = _history(store, checkpoints)
    await activator.activate(store.versions.get_version(v3))
    late = "c" * 16
    _rate(store, 2, late)  # after v3's cursor
    result = await _forgetting(store, activator).forget(late, dry_run=False)
    (plan,) = result.plan.lineages
    assert plan.in_memory and plan.first_trained is None and (plan.target, plan.affected) == (v2, (v3,))
    assert plan.replay == 4  # v3's ratings 9-12; the late key's are deleted
    assert result.deleted.ratings == 2 and result.done[0].rolled_back == (v3,)
    assert store.versions.cursor_version("sao") == v2 and store.feedback.get_cursor("sao") == plan.target_cursor
    assert store.versions.get_version(v3).status == S.ROLLED_BACK and engine.version == v2


async def test_a_key_that_never_rated_moves_nothing(engine, store, checkpoints):
    activator = Activator(engine, store.versions, store.operator, Metrics())
    v1, v2, v3, _ = _history(store, checkpoints)
    silent = "c" * 16
    store.feedback.insert_responses([ResponseRecord(
        id="silent", api_key_id=silent, model="m", policy_version=v3, endpoint="chat", prompt_ids=(1, 2, 3), response_ids=(4, 5),
        behavior_logprobs=(-0.5, -0.25), finish_reason="stop", temperature=1.0, top_p=1.0, latency_ms=1.0,
    )])
    result = await _forgetting(store, activator).forget(silent, dry_run=False)
    (plan,) = result.plan.lineages
    assert plan.target is None and not plan.in_memory and result.done == () and result.deleted.responses == 1
    assert store.versions.cursor_version("sao") == v3 and store.versions.get_version(v3).status == S.PUBLISHED
    with pytest.raises(KeyNotFound):
        await _forgetting(store, activator).forget("d" * 16, dry_run=True)


def test_a_segment_lineage_is_planned_on_its_own(store):
    """Adapters on: the key rated only in segment cozy; cozy's lineage goes back to the base weights,
    night's is left alone (no engine needed to plan)."""
    _rate(store, 2, segment="night")
    planted = _rate(store, 1, PLANTED, segment="cozy")[0]
    _rate(store, 2, segment="cozy")
    c1 = _publish(store, 0, None, planted + 2, lane="sao:cozy", segment="cozy")
    n1 = _publish(store, 0, None, planted + 2, lane="sao:night", segment="night")
    plan = plan_forget(store.rights, store.versions, store.feedback, PLANTED, [("sao:cozy", Lineage("cozy")), ("sao:night", Lineage("night"))])
    cozy, night = plan.lineages
    assert (cozy.first_trained, cozy.target, cozy.target_cursor, cozy.affected) == (c1, 0, 0, (c1,))
    assert cozy.replay == 2 and cozy.skipped == ()
    assert night.target is None and store.versions.cursor_version("sao:night") == n1
