"""The release gate as a deposed leader, on a real hf engine pair, real SQLite and PostgreSQL and real
leases: the replica read its lease term, was paused past its lease, and another holder took the lease
over in a higher term. Its gate still believes it leads in the old term (`leader` returns it), so it
tries to decide; the store refuses every write (StaleLeader) and nothing changes: no candidate is
started, the new leader's candidate is neither promoted (the engine keeps serving the live version)
nor held (the learner's cursor stays), no event is recorded. Leading again in the current term, the
same gate decides."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from liveloop.devtools import perturbed_checkpoint
from liveloop.metrics import Metrics
from liveloop.release.config import EvaluationConfig, ReleaseConfig
from liveloop.server.control.gate import ReleaseGate
from liveloop.server.control.activator import Activator
from liveloop.store import Store, VersionStatus
from liveloop.store.lease import LEADER

S = VersionStatus
LEASE = 0.6
PASSED = [{"name": "kl_to_live", "passed": True}]
FAILED = [{"name": "kl_to_live", "passed": False}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir) -> list[Path]:
    root = tmp_path_factory.mktemp("fencing-checkpoints")
    return [perturbed_checkpoint(model_dir, root / f"c{seed}", seed=seed) for seed in (1, 2)]


def _publish(store: Store, parent: int, checkpoint: Path) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=str(checkpoint), checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name="sao", last_feedback_id=0,
    ).version


def _snapshot(store: Store) -> tuple:
    versions = tuple((r.version, r.status) for r in store.versions.list_versions())
    events = tuple((e.id, e.kind, e.version) for e in store.operator.events())
    return versions, events, store.versions.cursor_version("sao")


async def test_a_deposed_leaders_gate_decides_nothing(canary_engine, store, checkpoints):
    leases = store.fleet.leases
    old = leases.acquire(LEADER, "r1/old", LEASE).term
    believed = [old]  # what the paused replica's gate reads as its term
    config = ReleaseConfig(mode="gated", evaluation=EvaluationConfig(max_tokens=8))
    activator = Activator(canary_engine, store.versions, store.operator, Metrics(), gate_base=True)
    gate = ReleaseGate(
        config, activator, canary_engine, store.versions, store.operator, store.release, activator.metrics, None, leader=lambda: believed[0],
    )

    v1 = _publish(store, 0, checkpoints[0])
    time.sleep(LEASE + 0.3)  # paused past its lease: another replica takes it over
    new = leases.acquire(LEADER, "r2/new", 60).term
    assert new == old + 1

    before = _snapshot(store)
    assert await gate.step() is None  # it tries to make v1 the candidate: refused
    assert _snapshot(store) == before and store.versions.canary_version(None) is None and canary_engine.candidate_version is None

    # the new leader makes v1 the candidate and passes its evaluation; the old one would promote it
    store.versions.start_canary(v1, term=new)
    store.release.record_evaluation(v1, 0, True, PASSED, 1.0, 0.5, term=new)
    before = _snapshot(store)
    decision = await gate.step()
    assert decision is not None and decision.action == "promote"
    assert _snapshot(store) == before and store.versions.get_version(v1).status == S.CANARY
    assert canary_engine.version == 0 and canary_engine.candidate_version == v1  # loaded, as on every replica; not promoted

    # a later evaluation fails it; the old leader would hold it and send the learner back
    store.release.record_evaluation(v1, 0, False, FAILED, 1.0, 0.5, term=new)
    assert store.versions.cursor_version("sao") == v1
    before = _snapshot(store)
    decision = await gate.step()
    assert decision is not None and decision.action == "hold"
    assert _snapshot(store) == before and store.versions.get_version(v1).status == S.CANARY and store.versions.cursor_version("sao") == v1
    assert canary_engine.candidate_version == v1

    # this replica leads again (the lease is its own in a newer term): its gate decides
    assert leases.release(LEADER, "r2/new")
    believed[0] = leases.acquire(LEADER, "r1/again", 60).term
    decision = await gate.step()
    assert decision is not None and decision.action == "hold"
    assert store.versions.get_version(v1).status == S.HELD and store.versions.cursor_version("sao") == 0
    assert [e.kind for e in store.operator.events()][-1] == "release_held"

    v2 = _publish(store, 0, checkpoints[1])  # the learner goes on from the live version
    await gate.step()
    assert store.versions.get_version(v2).status == S.CANARY
    store.release.record_evaluation(v2, 0, True, PASSED, 1.0, 0.5, term=believed[0])
    decision = await gate.step()
    assert decision is not None and decision.action == "promote"
    assert store.versions.get_version(v2).status == S.SERVING and canary_engine.version == v2
