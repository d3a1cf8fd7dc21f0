"""The store as the one owner of version state, on real SQLite and PostgreSQL: every status change is a
named transition checked inside its transaction (illegal moves and broken lineages are refused and
write nothing), version numbers are allocated inside the inserting transaction, an operator's publish
becomes the learner's lineage; and under threads racing rollbacks, operator publishes, learner
publishes and activations, numbers never collide, a rolled-back version never serves again and one
version at most serves."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from liveloop.store import RollbackRefused, ServingChanged, StaleLineage, Store, TransitionRefused, VersionStatus, VersionTaken
from liveloop.store.status import ACTIVATABLE, TRANSITIONS

S = VersionStatus


def _publish(store: Store, parent: int, version: int | None = None, cursor: str = "sao", segment: str | None = None) -> int:
    """A learner's publish: the store allocates the number (and names the checkpoint after it) unless
    one is proposed."""
    record = store.versions.publish_version(
        version, parent=parent, checkpoint_path=(lambda v: f"/ckpt/v{v}") if version is None else f"/ckpt/v{version}",
        checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={}, cursor_name=cursor, last_feedback_id=0, segment=segment,
    )
    return record.version


def _operator_publish(store: Store, parent: int) -> int:
    """What `POST /admin/weights` has the store do: a LOADING row (number allocated), then activation
    (after the engine swap) that makes it the learner's lineage."""
    version = store.versions.add_version(None, parent=parent, checkpoint_path="/operator/ckpt", status=S.LOADING).version
    store.versions.activate_version(version, cursor_name="sao")
    return version


def _statuses(store: Store) -> dict[int, VersionStatus]:
    return {v.version: v.status for v in store.versions.list_versions()}


# -- numbers --------------------------------------------------------------------------------------------
def test_numbers_are_allocated_inside_the_inserting_transaction(store):
    assert store.versions.add_version(None, parent=0, checkpoint_path="/a", status=S.LOADING).version == 1
    placed = []
    record = store.versions.publish_version(
        parent=0, checkpoint_path=lambda v: placed.append(v) or f"/ckpt/v{v}", checkpoint_sha256=None, learner_step=1,
        samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=3,
    )
    assert (record.version, placed, record.checkpoint_path) == (2, [2], "/ckpt/v2")
    assert (store.versions.cursor_version("sao"), store.feedback.get_cursor("sao")) == (2, 3)
    # a proposed number someone else took first is refused, and nothing is written
    with pytest.raises(VersionTaken):
        _publish(store, parent=2, version=2)
    assert store.versions.cursor_version("sao") == 2 and [v.version for v in store.versions.list_versions()] == [0, 1, 2]
    assert _publish(store, parent=2, version=7) == 7 and store.versions.next_version() == 8


def test_a_placement_that_fails_writes_nothing(store):
    def broken(version: int) -> str:
        raise OSError("the rename failed")

    with pytest.raises(OSError):
        store.versions.publish_version(
            parent=0, checkpoint_path=broken, checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
            cursor_name="sao", last_feedback_id=5,
        )
    assert [v.version for v in store.versions.list_versions()] == [0] and store.versions.cursor_version("sao") is None


def test_a_learner_publishes_published_or_candidate_only(store):
    with pytest.raises(TransitionRefused):
        store.versions.publish_version(
            parent=0, checkpoint_path="/x", checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
            cursor_name="sao", last_feedback_id=0, status=S.SERVING,
        )
    assert [v.version for v in store.versions.list_versions()] == [0]


# -- transitions -----------------------------------------------------------------------------------------
def test_activation_takes_only_published_or_loading_versions_on_the_line(store):
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    v3 = _publish(store, v2)
    activation = store.versions.activate_version(v3)  # overtakes 1 and 2
    assert (activation.previous, activation.superseded) == (0, [v1, v2])
    assert _statuses(store) == {0: S.RETIRED, v1: S.SUPERSEDED, v2: S.SUPERSEDED, v3: S.SERVING}
    for version in (0, v1, v2, v3):  # retired, superseded, serving: none of them is activated again
        with pytest.raises(TransitionRefused):
            store.versions.check_activation(version)
        with pytest.raises(TransitionRefused):
            store.versions.activate_version(version)
    assert _statuses(store) == {0: S.RETIRED, v1: S.SUPERSEDED, v2: S.SUPERSEDED, v3: S.SERVING}

    v4 = _publish(store, v3)
    assert store.versions.rollback_to(v3, "sao") == [v4]
    with pytest.raises(TransitionRefused, match="rolled_back"):
        store.versions.activate_version(v4)
    with pytest.raises(TransitionRefused, match="rolled_back"):
        store.versions.fail_version(v4)  # only a version being activated fails
    v5 = _publish(store, v3)
    assert store.versions.fail_version(v5).status == S.FAILED
    with pytest.raises(TransitionRefused):
        store.versions.fail_version(v5)  # failed is final
    with pytest.raises(TransitionRefused):
        store.versions.activate_version(v5)
    with pytest.raises(RollbackRefused):
        store.versions.rollback_to(v5, "sao")
    assert _statuses(store) == {0: S.RETIRED, v1: S.SUPERSEDED, v2: S.SUPERSEDED, v3: S.SERVING, v4: S.ROLLED_BACK, v5: S.FAILED}


def test_a_version_off_the_serving_line_is_refused_and_dropped(store):
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    v2 = _publish(store, v1)
    assert store.versions.rollback_to(0, "sao") == [v1, v2]
    v3 = _publish(store, 0)  # the learner's new line, on 0
    # an admin row whose parent is a rolled-back version (read before the rollback): off the line
    stale = store.versions.add_version(None, parent=v1, checkpoint_path="/op", status=S.LOADING).version
    with pytest.raises(TransitionRefused, match="does not descend"):
        store.versions.activate_version(stale)
    store.versions.activate_version(v3)
    # a learner version on the old serving version, published before an operator's swap (the watcher
    # finds it later): refused, and dropped as superseded
    v5 = store.versions.publish_version(
        parent=v3, checkpoint_path="/v5", checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
        cursor_name="other", last_feedback_id=0,
    ).version
    v6 = _operator_publish(store, v3)
    assert _statuses(store)[v5] == S.SUPERSEDED  # the operator's activation left it off the line
    v7 = store.versions.publish_version(
        parent=v3, checkpoint_path="/v7", checkpoint_sha256=None, learner_step=1, samples_used=1, metrics={},
        cursor_name="another", last_feedback_id=0,
    ).version
    with pytest.raises(TransitionRefused):
        store.versions.check_activation(v7)
    assert store.versions.drop_activation(v7, "lost a race") is True
    assert _statuses(store)[v7] == S.SUPERSEDED and store.versions.latest_version().version == v6
    assert store.operator.events()[-1].kind == "activation_dropped"


def test_an_operator_publish_becomes_the_learner_lineage(store):
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    assert store.versions.cursor_version("sao") == v1
    op = _operator_publish(store, v1)
    assert store.versions.cursor_version("sao") == op and store.versions.latest_version().version == op
    # the learner, still on v1, publishes: refused; after reloading (its cursor) it publishes on op
    with pytest.raises(StaleLineage, match=f"lineage is now {op}"):
        _publish(store, v1)
    v3 = _publish(store, op)
    store.versions.activate_version(v3)
    assert _statuses(store) == {0: S.RETIRED, v1: S.RETIRED, op: S.RETIRED, v3: S.SERVING}
    assert [e.kind for e in store.operator.events()] == ["publish"]


def test_adapter_lineages_activate_independently(store):
    cozy = _publish(store, 0, cursor="sao:cozy", segment="cozy")
    night = _publish(store, 0, cursor="sao:night", segment="night")
    store.versions.activate_version(cozy)
    store.versions.activate_version(night)
    cozy2 = _publish(store, cozy, cursor="sao:cozy", segment="cozy")
    assert store.versions.activate_version(cozy2).previous == cozy
    assert store.versions.rollback_to(0, "sao:cozy", segment="cozy") == [cozy, cozy2]
    with pytest.raises(TransitionRefused):
        store.versions.activate_version(cozy2)
    assert {s: r.version for s, r in store.versions.serving_adapters().items()} == {"night": night}
    assert store.versions.get_version(0).status == S.SERVING


def test_start_up_recovery_fails_the_lost_versions_and_serves_the_ancestor(store):
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    v2 = _publish(store, v1)
    store.versions.activate_version(v2)
    store.versions.recover_serving([v2, v1], 0)
    assert _statuses(store) == {0: S.SERVING, v1: S.FAILED, v2: S.FAILED}


# -- any sequence of operations -------------------------------------------------------------------------
OPS = st.lists(st.sampled_from(["learn", "operator", "activate", "rollback", "fail", "supersede", "activate_any", "rollback_any"]), min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_any_sequence_keeps_the_invariants(store, ops, seed):
    """Random operations, each checked against the table: a change the store accepts is a legal move
    of the versions it touches; one it refuses changes nothing."""
    rng = random.Random(seed)
    for op in ops:
        before = _statuses(store)
        serving = store.versions.latest_version()
        versions = sorted(before)
        try:
            if op == "learn":
                _publish(store, store.versions.cursor_version("sao") if store.versions.cursor_version("sao") is not None else serving.version)
            elif op == "operator":
                _operator_publish(store, serving.version)
            elif op == "activate":
                waiting = store.versions.versions_with_status(S.PUBLISHED, serving.version)
                if waiting:
                    store.versions.activate_version(waiting[-1].version)
            elif op == "rollback" and serving.parent is not None:
                store.versions.rollback_to(serving.parent, "sao")
            elif op == "fail":
                store.versions.fail_version(rng.choice(versions))
            elif op == "supersede":
                store.versions.supersede([rng.choice(versions)])
            elif op == "activate_any":
                target = rng.choice(versions)
                store.versions.activate_version(target)
                assert before[target] in ACTIVATABLE
            elif op == "rollback_any":
                store.versions.rollback_to(rng.choice(versions), "sao")
        except (TransitionRefused, RollbackRefused, StaleLineage):
            after = _statuses(store)
            assert after == before, f"{op} was refused but changed {before} -> {after}"
            continue
        after = _statuses(store)
        for version, status in after.items():
            if version in before and before[version] != status:
                assert status in TRANSITIONS[before[version]], f"{op}: version {version} {before[version]} -> {status}"
            if before.get(version) == S.ROLLED_BACK and status == S.SERVING:
                assert op.startswith("rollback"), f"{op} served rolled-back version {version}"  # only an operator's rollback to it
        assert len([v for v in store.versions.list_versions() if v.status == S.SERVING and v.segment is None]) == 1


# -- races ------------------------------------------------------------------------------------------------
def test_racing_rollbacks_publishes_and_activations(store):
    """Four writers race (about two hundred operations in all, until each has won once), as the server's
    publisher, an operator, a learner and the guard would, without any lock of their own: the store
    is the only thing that serialises them. A checker snapshots the statuses meanwhile."""
    stop = threading.Event()
    errors: list[BaseException] = []
    numbers: list[int] = []
    numbers_lock = threading.Lock()
    ops = {"learn": 0, "operator": 0, "activate": 0, "rollback": 0, "refused": 0}

    def allocated(version: int) -> None:
        with numbers_lock:
            numbers.append(version)

    def learner() -> None:
        while not stop.is_set():
            parent = store.versions.cursor_version("sao")
            try:
                allocated(_publish(store, parent if parent is not None else 0))
                ops["learn"] += 1
            except StaleLineage:
                ops["refused"] += 1

    def operator() -> None:
        while not stop.is_set():
            parent = store.versions.latest_version().version  # read outside any lock, like a stale engine.version
            version = store.versions.add_version(None, parent=parent, checkpoint_path="/op", status=S.LOADING).version
            allocated(version)
            try:
                store.versions.activate_version(version, cursor_name="sao")
                ops["operator"] += 1
            except TransitionRefused:
                store.versions.fail_version(version)
                ops["refused"] += 1
            time.sleep(0.02)

    def watcher() -> None:
        while not stop.is_set():
            serving = store.versions.latest_version().version
            waiting = store.versions.versions_with_status(S.PUBLISHED, serving)
            if not waiting:
                time.sleep(0.002)
                continue
            try:
                store.versions.activate_version(waiting[-1].version)
                ops["activate"] += 1
            except TransitionRefused as exc:
                store.versions.drop_activation(waiting[-1].version, str(exc))
                ops["refused"] += 1

    def guard() -> None:
        while not stop.is_set():
            serving = store.versions.latest_version()
            if serving.parent is not None:
                try:
                    store.versions.rollback_to(serving.parent, "sao")
                    ops["rollback"] += 1
                except RollbackRefused:
                    ops["refused"] += 1
            time.sleep(0.03)

    rolled_back: set[int] = set()
    snapshots = 0

    def check() -> None:
        nonlocal snapshots
        while not stop.is_set():
            statuses = _statuses(store)
            serving = [v for v, s in statuses.items() if s == S.SERVING]
            assert len(serving) == 1, f"serving: {serving}"
            assert not rolled_back & set(serving), f"rolled-back version {serving} serves again"
            rolled_back.update(v for v, s in statuses.items() if s == S.ROLLED_BACK)
            snapshots += 1

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                stop.set()
        return threading.Thread(target=run, name=fn.__name__)

    threads = [guarded(f) for f in (learner, operator, watcher, guard, check)]
    for t in threads:
        t.start()
    # the race runs until every actor has won at least once and about two hundred operations happened: a
    # verdict on events, not on how many fit in a wall-clock window (a loaded machine is only slower). The
    # deadline is a hang guard, many times what any machine needs
    winners = ("learn", "operator", "activate", "rollback")
    deadline = time.monotonic() + 600
    while not stop.is_set() and time.monotonic() < deadline and (sum(ops.values()) < 200 or not all(ops[k] for k in winners)):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(numbers) == len(set(numbers)), "a version number was handed out twice"
    assert sorted(numbers) == [v for v in sorted(_statuses(store)) if v != 0]
    assert ops["learn"] and ops["operator"] and ops["activate"] and ops["rollback"] and snapshots, ops
    final = _statuses(store)
    assert list(final.values()).count(S.SERVING) == 1
    # every rollback's victims stay off: none serves, and nothing serving descends from one
    serving = store.versions.latest_version()
    chain, current = [], serving
    while current.parent is not None:
        current = store.versions.get_version(current.parent)
        chain.append(current.status)
    assert S.ROLLED_BACK not in chain


def test_a_rollback_on_a_stale_view_changes_nothing(store):
    """Two operators saw v2 serving; both roll back to its parent, then the second one's rollback to v2's
    sibling on the same view is refused whole: ServingChanged, no status moved, the cursor unmoved."""
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    v2 = _publish(store, v1)
    store.versions.activate_version(v2)
    assert store.versions.rollback_to(v1, "sao", expect_serving=v2) == [v2]
    before = _statuses(store)
    with pytest.raises(ServingChanged):
        store.versions.rollback_to(0, "sao", expect_serving=v2)
    assert _statuses(store) == before and store.versions.cursor_version("sao") == v1
    assert store.versions.rollback_to(0, "sao", expect_serving=v1) == [v1]  # the view that is current goes through


def test_a_segment_without_an_adapter_is_expected_to_serve_the_base(store):
    night = _publish(store, 0, cursor="sao:night", segment="night")
    store.versions.activate_version(night)
    store.versions.rollback_to(0, "sao:night", segment="night", expect_serving=night)  # the base serves the segment now
    with pytest.raises(ServingChanged):
        store.versions.rollback_to(night, "sao:night", segment="night", expect_serving=night)
    assert store.versions.rollback_to(night, "sao:night", segment="night", expect_serving=0) == []
    assert {s: r.version for s, r in store.versions.serving_adapters().items()} == {"night": night}


def test_a_rollbacks_reason_is_recorded_with_it_or_not_at_all(store):
    """The guard's verdict event rides in the rollback's transaction: a refused rollback leaves neither."""
    v1 = _publish(store, 0)
    store.versions.activate_version(v1)
    verdict = ("guard_rollback", {"version": v1, "parent": 0})
    with pytest.raises(ServingChanged):
        store.versions.rollback_to(0, "sao", expect_serving=0, event=verdict)
    assert [e.kind for e in store.operator.events(None, 50) if e.kind in ("rollback", "guard_rollback")] == []
    assert store.versions.rollback_to(0, "sao", expect_serving=v1, event=verdict) == [v1]
    done = [(e.kind, e.version) for e in store.operator.events(None, 50) if e.kind in ("rollback", "guard_rollback")]
    assert sorted(done) == [("guard_rollback", 0), ("rollback", 0)]
