"""The store's side of the release gate, on real SQLite and PostgreSQL: a published version becomes its
lineage's one CANARY candidate (descending from the serving version; the older published versions are
superseded: newest wins), promotion is its activation (the versions trained on from it stay waiting),
holding it supersedes its descendants and sends the learner's cursor back to the serving version with
its feedback position kept, a held version stays servable by an operator's rollback; under any
sequence of gate and lifecycle operations every change is a legal move and a lineage never has two
candidates. Each candidate's evaluations are stored per version (the latest is its word), and the
alarms read a version's rated replies; the schema comes from migration 0010 on a live 0009 database."""

from __future__ import annotations

import math
import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liveloop.store import (
    FeedbackRecord,
    InvalidEvaluation,
    ResponseRecord,
    RollbackRefused,
    StaleLineage,
    Store,
    StoreConfig,
    TransitionRefused,
    VersionNotFound,
    VersionStatus,
)
from liveloop.store import migrate
from liveloop.store.status import TRANSITIONS

S = VersionStatus


def _publish(store: Store, parent: int, cursor: str = "sao", segment: str | None = None, last_feedback_id: int = 0) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=lambda v: f"/ckpt/v{v}", checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name=cursor, last_feedback_id=last_feedback_id, segment=segment,
    ).version


def _statuses(store: Store) -> dict[int, VersionStatus]:
    return {v.version: v.status for v in store.versions.list_versions()}


# -- candidates ----------------------------------------------------------------------------------------
def test_the_newest_published_version_becomes_the_one_candidate(store):
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    v3 = _publish(store, v2)
    assert store.versions.canary_version() is None
    record = store.versions.start_canary(v3)
    assert record.status == S.CANARY and store.versions.canary_version().version == v3
    # the older published versions are superseded in the same transaction: v3 contains their training
    assert _statuses(store) == {0: S.SERVING, v1: S.SUPERSEDED, v2: S.SUPERSEDED, v3: S.CANARY}
    event = store.operator.events()[-1]
    assert (event.kind, event.version, event.detail["superseded"], event.detail["serving"]) == ("canary", v3, [v1, v2], 0)
    # one candidate per lineage: the learner keeps publishing, but nothing else becomes a candidate
    v4 = _publish(store, v3)
    with pytest.raises(TransitionRefused, match=f"version {v3} is its lineage's candidate"):
        store.versions.start_canary(v4)
    for version in (0, v1, v3):  # serving, superseded, canary already: not published
        with pytest.raises(TransitionRefused):
            store.versions.start_canary(version)
    with pytest.raises(VersionNotFound):
        store.versions.start_canary(99)
    assert _statuses(store) == {0: S.SERVING, v1: S.SUPERSEDED, v2: S.SUPERSEDED, v3: S.CANARY, v4: S.PUBLISHED}


def test_a_candidate_must_descend_from_the_serving_version(store):
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    v2 = _publish(store, v1)
    assert store.versions.rollback_to(0, "sao") == [v1, v2]
    stale = store.versions.add_version(None, parent=v1, checkpoint_path="/x", status=S.PUBLISHED).version  # built on an undone line
    with pytest.raises(TransitionRefused, match="does not descend"):
        store.versions.start_canary(stale)
    assert store.versions.get_version(stale).status == S.PUBLISHED and store.versions.canary_version() is None


def test_promotion_is_the_candidates_activation(store):
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    store.versions.start_canary(v2)
    v3 = _publish(store, v2)  # trained on from the candidate while it is tried
    v4 = _publish(store, v3)
    store.versions.check_activation(v2)
    activation = store.versions.activate_version(v2)
    assert (activation.version, activation.previous, activation.superseded) == (v2, 0, [])
    assert _statuses(store) == {0: S.RETIRED, v1: S.SUPERSEDED, v2: S.SERVING, v3: S.PUBLISHED, v4: S.PUBLISHED}
    assert store.versions.canary_version() is None and store.versions.latest_version().version == v2
    # the newest published version on the new serving one is the next candidate; v3 is merged into it
    store.versions.start_canary(v4)
    assert _statuses(store)[v3] == S.SUPERSEDED and store.versions.canary_version().version == v4


def test_an_activation_that_overtakes_a_candidate_supersedes_it(store):
    """An operator's publish while a candidate is tried: the candidate is off the new line."""
    v1 = _publish(store, 0)
    store.versions.start_canary(v1)
    op = store.versions.add_version(None, parent=0, checkpoint_path="/operator", status=S.LOADING).version
    activation = store.versions.activate_version(op, cursor_name="sao")
    assert activation.superseded == [v1]
    assert _statuses(store) == {0: S.RETIRED, v1: S.SUPERSEDED, op: S.SERVING} and store.versions.canary_version() is None


def test_holding_supersedes_its_descendants_and_sends_the_learner_back_to_the_live_version(store):
    v1 = _publish(store, 0, last_feedback_id=10)
    store.versions.activate_version(v1)
    v2 = _publish(store, v1, last_feedback_id=20)
    store.versions.start_canary(v2)
    v3 = _publish(store, v2, last_feedback_id=30)
    v4 = _publish(store, v3, last_feedback_id=40)
    assert (store.versions.cursor_version("sao"), store.feedback.get_cursor("sao")) == (v4, 40)
    record = store.versions.hold_version(v2, "evaluation failed", "sao", {"checks": ["sycophancy"]})
    assert record.status == S.HELD and record.status.servable
    assert _statuses(store) == {0: S.RETIRED, v1: S.SERVING, v2: S.HELD, v3: S.SUPERSEDED, v4: S.SUPERSEDED}
    # the learner's lineage is the live version again; its feedback position is kept (the ratings
    # that made the held version are not trained again)
    assert (store.versions.cursor_version("sao"), store.feedback.get_cursor("sao")) == (v1, 40)
    with pytest.raises(StaleLineage):
        _publish(store, v4)
    event = store.operator.events()[-1]
    assert (event.kind, event.version) == ("release_held", v2)
    assert event.detail["reason"] == "evaluation failed" and event.detail["detail"] == {"checks": ["sycophancy"]}
    assert event.detail["superseded"] == [v3, v4] and event.detail["cursor"] == {"from": v4, "to": v1}
    # the learner goes on from the live version; the next candidate descends from it
    v5 = _publish(store, v1, last_feedback_id=50)
    assert store.versions.start_canary(v5).status == S.CANARY
    # held is not a candidate again, and is held once only
    for version in (v2, v1):
        with pytest.raises(TransitionRefused):
            store.versions.hold_version(version, "again", "sao")
    with pytest.raises(TransitionRefused):
        store.versions.activate_version(v2)


def test_a_published_version_may_be_held_and_an_unrelated_cursor_is_left_alone(store):
    v1 = _publish(store, 0, last_feedback_id=5)
    v2 = _publish(store, 0, cursor="other", last_feedback_id=7)  # another learner's line, not from v1
    store.versions.hold_version(v1, "reward hacking: flattery", "other", {"share": math.inf, "z": math.nan, "gain": 0.25})
    assert _statuses(store) == {0: S.SERVING, v1: S.HELD, v2: S.PUBLISHED}
    assert (store.versions.cursor_version("other"), store.feedback.get_cursor("other")) == (v2, 7)
    assert store.operator.events()[-1].detail["cursor"] is None
    assert store.operator.events()[-1].detail["detail"] == {"share": None, "z": None, "gain": 0.25}  # PostgreSQL's JSON has no NaN


def test_an_operator_may_roll_back_to_a_held_version(store):
    v1 = _publish(store, 0)
    store.versions.start_canary(v1)
    store.versions.hold_version(v1, "rated worse", "sao")
    assert store.versions.rollback_to(v1, "sao") == []
    assert _statuses(store) == {0: S.RETIRED, v1: S.SERVING} and store.versions.cursor_version("sao") == v1
    # and a rollback undoes a candidate like any later version
    v2 = _publish(store, v1)
    store.versions.start_canary(v2)
    assert store.versions.rollback_to(0, "sao") == [v1, v2]
    assert store.versions.canary_version() is None


def test_a_candidates_weights_that_fail_fail_it(store):
    v1 = _publish(store, 0)
    store.versions.start_canary(v1)
    assert store.versions.fail_version(v1).status == S.FAILED and store.versions.canary_version() is None


def test_segment_lineages_have_a_candidate_each(store):
    base = _publish(store, 0)
    cozy = _publish(store, 0, cursor="sao:cozy", segment="cozy", last_feedback_id=3)
    night = _publish(store, 0, cursor="sao:night", segment="night")
    for version in (base, cozy, night):
        store.versions.start_canary(version)
    assert {seg: store.versions.canary_version(seg).version for seg in (None, "cozy", "night")} == {None: base, "cozy": cozy, "night": night}
    # a segment served by the base (no adapter serves it yet): holding its candidate points the lane
    # back at the base's serving version, as a rollback of the segment to the base does
    store.versions.hold_version(cozy, "evaluation failed", "sao:cozy")
    assert (store.versions.cursor_version("sao:cozy"), store.feedback.get_cursor("sao:cozy")) == (0, 3)
    assert store.versions.canary_version("cozy") is None and store.versions.canary_version("night").version == night
    assert store.operator.events()[-1].detail["segment"] == "cozy"
    store.versions.activate_version(night)
    assert store.versions.serving_adapters()["night"].version == night and store.versions.canary_version() .version == base


def test_racing_gates_start_one_candidate(store):
    """Two servers' gates race to start a candidate on the same lineage: one wins, one is refused."""
    versions = [_publish(store, 0)]
    versions.append(_publish(store, versions[0]))
    barrier = threading.Barrier(2)
    results: list[object] = [None, None]

    def gate(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.versions.start_canary(versions[i]).version
        except TransitionRefused as exc:
            results[i] = exc

    threads = [threading.Thread(target=gate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(isinstance(r, int) for r in results) == 1 and sum(isinstance(r, TransitionRefused) for r in results) == 1
    assert len([v for v in store.versions.list_versions() if v.status == S.CANARY]) == 1


# -- any sequence of operations ------------------------------------------------------------------------
OPS = st.lists(
    st.sampled_from(["learn", "canary", "promote", "hold", "hold_any", "activate_any", "rollback", "rollback_any", "fail"]),
    min_size=1, max_size=25,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_any_sequence_of_gate_operations_keeps_the_invariants(store, ops, seed):
    """Gate operations mixed with the lifecycle's: a change the store accepts is a legal move of the
    versions it touches, one it refuses changes nothing, one version serves, at most one is a candidate,
    and a candidate always descends from the serving version."""
    rng = random.Random(seed)
    for op in ops:
        before = _statuses(store)
        versions = sorted(before)
        serving = store.versions.latest_version()
        try:
            if op == "learn":
                parent = store.versions.cursor_version("sao")
                _publish(store, parent if parent is not None else serving.version)
            elif op == "canary":
                waiting = store.versions.versions_with_status(S.PUBLISHED)
                if waiting:
                    store.versions.start_canary(waiting[-1].version)
            elif op == "promote" and store.versions.canary_version() is not None:
                store.versions.activate_version(store.versions.canary_version().version)
            elif op == "hold" and store.versions.canary_version() is not None:
                store.versions.hold_version(store.versions.canary_version().version, "test", "sao")
            elif op == "hold_any":
                store.versions.hold_version(rng.choice(versions), "test", "sao")
            elif op == "activate_any":
                store.versions.activate_version(rng.choice(versions))
            elif op == "rollback" and serving.parent is not None:
                store.versions.rollback_to(serving.parent, "sao")
            elif op == "rollback_any":
                store.versions.rollback_to(rng.choice(versions), "sao")
            elif op == "fail":
                store.versions.fail_version(rng.choice(versions))
        except (TransitionRefused, RollbackRefused, StaleLineage):
            assert _statuses(store) == before, f"{op} was refused but changed something"
            continue
        after = _statuses(store)
        for version, status in after.items():
            if version in before and before[version] != status:
                assert status in TRANSITIONS[before[version]], f"{op}: version {version} {before[version]} -> {status}"
            if before.get(version) == S.HELD and status == S.SERVING:
                assert op.startswith("rollback"), f"{op} served held version {version}"
        assert len([s for s in after.values() if s == S.SERVING]) == 1
        candidates = [v for v in store.versions.list_versions() if v.status == S.CANARY]
        assert len(candidates) <= 1
        if candidates and op in ("canary", "promote"):
            assert store.versions.check_activation(candidates[0].version).version == candidates[0].version


# -- evaluations ---------------------------------------------------------------------------------------
CHECKS = [
    {"name": "reward:length", "value": 0.5, "live": 0.4, "base": 0.3, "bound": "drop <= 0.1", "passed": True},
    {"name": "sycophancy", "value": 0.9, "live": 0.1, "base": None, "bound": "rise <= 0.2", "passed": False},
]


def test_evaluations_are_stored_per_version_and_the_latest_is_its_word(store):
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    assert store.release.evaluation(v1) is None and store.release.evaluations([0, v1, v2]) == {}
    first = store.release.record_evaluation(v1, 0, False, CHECKS, 12.5, 8.25)
    assert (first.version, first.live_version, first.passed, first.checks, first.seconds, first.engine_seconds) == (
        v1, 0, False, CHECKS, 12.5, 8.25,
    )
    assert first.created_at.tzinfo is not None
    assert store.release.evaluation(v1) == first
    again = store.release.record_evaluation(v1, 0, True, CHECKS[:1], 3.0, 2.0)  # evaluated again (a restart)
    other = store.release.record_evaluation(v2, None, True, [], 1.0, 0.0)  # nothing served to compare with
    assert store.release.evaluation(v1) == again and store.release.evaluation(v2) == other and store.release.evaluation(0) is None
    assert store.release.evaluations([v2, v1, 0, 99]) == {v1: again, v2: other} and store.release.evaluations([]) == {}


def test_evaluation_values_the_databases_cannot_hold_read_back_as_none(store):
    np = pytest.importorskip("numpy")
    checks = [{"name": "kl_to_live", "value": math.nan, "live": np.float32(0.25), "base": math.inf, "bound": None, "passed": True}]
    record = store.release.record_evaluation(0, None, True, checks, 1.0, 0.5)
    assert record.checks == [{"name": "kl_to_live", "value": None, "live": 0.25, "base": None, "bound": None, "passed": True}]
    assert store.release.evaluation(0).checks == record.checks


def test_malformed_evaluations_and_unknown_versions_are_refused(store):
    for checks in ({"name": "x"}, "checks", [{"value": 1}], [{"name": ""}], [3]):
        with pytest.raises(InvalidEvaluation):
            store.release.record_evaluation(0, None, True, checks, 1.0, 1.0)
    with pytest.raises(VersionNotFound):
        store.release.record_evaluation(42, 0, True, CHECKS, 1.0, 1.0)
    assert store.release.evaluations([0, 42]) == {}


# -- what the alarms read ------------------------------------------------------------------------------
def _served(store: Store, rid: str, version: int, reply: tuple[int, ...], key: str = "k1") -> None:
    store.feedback.write_batch([ResponseRecord(
        id=rid, api_key_id=key, model="m", policy_version=version, endpoint="chat", prompt_ids=(1, 2),
        response_ids=reply, behavior_logprobs=tuple(-0.5 for _ in reply), finish_reason="stop",
        temperature=1.0, top_p=1.0, latency_ms=1.0,
    )])


def test_rated_tokens_are_a_versions_rated_replies_newest_first(store):
    v1 = _publish(store, 0)
    _served(store, "a", v1, (10, 11, 12))
    _served(store, "b", v1, (20,))
    _served(store, "c", v1, (30, 31))  # never rated
    _served(store, "d", 0, (40,))  # another version's
    _served(store, "e", v1, (50, 51), key="bad")
    store.feedback.put_feedback(FeedbackRecord("a", "k1", 1))
    store.feedback.put_feedback(FeedbackRecord("b", "k1", 0))
    store.feedback.put_feedback(FeedbackRecord("d", "k1", 1))
    store.feedback.put_feedback(FeedbackRecord("e", "bad", 1))
    store.feedback.put_feedback(FeedbackRecord("a", "k1", 0))  # a change of mind: the latest reward, same place
    assert store.release.rated_tokens(v1) == [([50, 51], 1), ([20], 0), ([10, 11, 12], 0)]
    assert store.release.rated_tokens(v1, limit=2) == [([50, 51], 1), ([20], 0)]
    assert store.release.rated_tokens(0) == [([40], 1)] and store.release.rated_tokens(99) == []
    store.keys.set_quarantined("bad", True, "poisoner")  # its ratings are not trusted, unless asked for
    assert store.release.rated_tokens(v1) == [([20], 0), ([10, 11, 12], 0)]
    assert len(store.release.rated_tokens(v1, trusted=False)) == 3


# -- the schema ----------------------------------------------------------------------------------------
def test_migration_0010_adds_evaluations_to_a_live_0009_database(store_url):
    s = Store(StoreConfig(url=store_url))
    try:
        assert migrate.upgrade(s.engine, "0009") == "0009"
        s.versions.add_version(0, parent=None, checkpoint_path="/base")
        s.versions.add_version(1, parent=0, checkpoint_path="/v1", status=S.PUBLISHED)
        assert s.migrate() == migrate.head_revision() and migrate.head_revision() >= "0010"
        assert [v.version for v in s.versions.list_versions()] == [0, 1]
        assert s.versions.start_canary(1).status == S.CANARY  # the statuses need no schema change
        s.release.record_evaluation(1, 0, True, CHECKS, 2.0, 1.0)
        assert s.release.evaluation(1).checks == CHECKS
        assert migrate.downgrade(s.engine, "0009") == "0009"
        assert [(v.version, v.status) for v in s.versions.list_versions()] == [(0, S.SERVING), (1, S.CANARY)]
        assert s.migrate() == migrate.head_revision() and s.release.evaluation(1) is None  # the table is new again
    finally:
        s.close()


def test_version_traffic_of_the_candidate_and_the_live_version_only(store):
    """What the gate compares each pass: the candidate's and the live version's counts, not every version's."""
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    for i, (version, reward, key) in enumerate([(0, 1, "k1"), (0, 0, "k1"), (v1, 1, "k1"), (v2, 1, "k1"), (v2, 0, "bad")]):
        _served(store, f"r{i}", version, (i,), key=key)
        store.feedback.put_feedback(FeedbackRecord(f"r{i}", key, reward))
    _served(store, "unrated", v2, (9,))
    store.keys.set_quarantined("bad", True, "poisoner")
    traffic = store.release.version_traffic(trusted=True, versions=[v2, 0])
    assert {v: (t.responses, t.ratings, t.positive) for v, t in traffic.items()} == {0: (2, 2, 1), v2: (3, 1, 1)}
    assert set(store.release.version_traffic()) == {0, v1, v2} and store.release.version_traffic(versions=[]) == {}
