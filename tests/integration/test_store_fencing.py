"""Fenced leader writes (store/lease.py `fenced`, store/versions.py, store/release.py) on real
SQLite and PostgreSQL, as the attacker: a leader deposed while it was paused (its lease expired and
another holder took it over, in a higher term) still carries its old term; every decision it tries
(a candidate, a promotion, a hold, a rollback, an evaluation) is refused with StaleLeader and leaves
the store as it was, while the new leader's, in the current term, go through. A released or merely
expired lease fences its old term too, and a takeover cannot slip in between a fenced check and its
commit."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig, VersionStatus
from liveloop.store.lease import LEADER, Leases, StaleLeader, fenced

S = VersionStatus
CURSOR = "sao"
LEASE = 0.6  # seconds: short, so the old leader's lease expires within the test


def _publish(store: Store, parent: int) -> int:
    return store.versions.publish_version(
        parent=parent, checkpoint_path=f"/ckpt/{parent}-next", checkpoint_sha256=None, learner_step=1, samples_used=1,
        metrics={}, cursor_name=CURSOR, last_feedback_id=0,
    ).version


def _depose(leases: Leases) -> tuple[int, int]:
    """The old leader takes the lease, is paused past its expiry, and a new holder takes it over."""
    old = leases.acquire(LEADER, "old/1", LEASE)
    time.sleep(LEASE + 0.3)
    new = leases.acquire(LEADER, "new/1", 30)
    assert old.held and new.held and new.term == old.term + 1
    return old.term, new.term


def _snapshot(store: Store) -> tuple:
    versions = tuple((r.version, r.status) for r in store.versions.list_versions())
    events = tuple((e.id, e.kind, e.version) for e in store.operator.events())
    keys = tuple((k.key_id, k.quarantined) for k in store.keys.key_states())
    return versions, events, store.versions.cursor_version(CURSOR), keys, store.feedback.counts()["responses"]


def _attempts(store: Store, version: int, term: int) -> dict:
    """Every leader-only write a gate or guard makes, as `term`."""
    return {
        "start_canary": lambda: store.versions.start_canary(version, term=term),
        "check_activation": lambda: store.versions.check_activation(version, term=term),
        "activate_version": lambda: store.versions.activate_version(version, term=term),
        "hold_version": lambda: store.versions.hold_version(version, "worse", CURSOR, {"p_worse": 0.99}, term=term),
        "rollback_to": lambda: store.versions.rollback_to(0, CURSOR, reason="guard", term=term),
        "record_evaluation": lambda: store.release.record_evaluation(version, 0, False, [{"name": "kl", "passed": False}], 1.0, 0.5, term=term),
        # the monitor loop's: an automatic quarantine, a drift alarm, retention's deletion
        "set_quarantined": lambda: store.keys.set_quarantined("k-honest", True, "automatic", None, term=term),
        "record_event": lambda: store.operator.record_event("alarm", version, {"direction": "down"}, term=term),
        "delete_before": lambda: store.rights.delete_before(datetime.now(timezone.utc) + timedelta(days=1), term=term),
    }


def _served(store: Store) -> None:
    """One served response of a key, rated: what the monitor's writes would act on."""
    store.feedback.insert_responses([ResponseRecord("r-1", "k-honest", "m", 0, "chat", (1, 2), (3,), (-0.5,), "stop", 1.0, 1.0, 1.0)])
    store.feedback.put_feedback(FeedbackRecord("r-1", "k-honest", 1))


def test_a_deposed_leader_decides_nothing(store):
    leases = store.fleet.leases
    v1 = _publish(store, 0)
    v2 = _publish(store, v1)
    _served(store)
    old, new = _depose(leases)

    before = _snapshot(store)
    for name, attempt in _attempts(store, v1, old).items():
        with pytest.raises(StaleLeader, match=f"term {new}"):
            attempt()
        assert _snapshot(store) == before, name
    assert store.release.evaluation(v1) is None and store.versions.canary_version(None) is None

    # the new leader, in its term, decides: v2 (newest) is the candidate, evaluated, held
    assert store.versions.start_canary(v2, term=new).status == S.CANARY
    store.release.record_evaluation(v2, 0, False, [{"name": "kl", "passed": False}], 1.0, 0.5, term=new)
    assert store.release.evaluation(v2) is not None

    # the old leader comes back and tries to promote the new leader's candidate, then to hold it
    before = _snapshot(store)
    with pytest.raises(StaleLeader):
        store.versions.activate_version(v2, term=old)
    with pytest.raises(StaleLeader):
        store.versions.hold_version(v2, "worse", CURSOR, term=old)
    assert _snapshot(store) == before and store.versions.get_version(v2).status == S.CANARY

    store.versions.hold_version(v2, "evaluation failed", CURSOR, term=new)
    assert store.versions.get_version(v2).status == S.HELD and store.versions.cursor_version(CURSOR) == 0


def test_a_released_or_expired_lease_fences_its_term(store):
    leases = store.fleet.leases
    v1 = _publish(store, 0)
    with pytest.raises(StaleLeader, match="nobody ever held"):  # no lease row yet: no term leads
        store.versions.start_canary(v1, term=1)

    term = leases.acquire(LEADER, "a/1", 30).term
    assert leases.release(LEADER, "a/1")  # a clean stop: the row keeps its term, but nobody holds it
    with pytest.raises(StaleLeader, match="released"):
        store.versions.start_canary(v1, term=term)

    again = leases.acquire(LEADER, "a/1", LEASE)  # the same holder again: a new term
    assert again.term == term + 1
    with pytest.raises(StaleLeader):
        store.versions.start_canary(v1, term=term)
    time.sleep(LEASE + 0.3)  # expired, nobody took it over yet: still not a leader's write
    with pytest.raises(StaleLeader, match="expired"):
        store.versions.start_canary(v1, term=again.term)
    assert store.versions.get_version(v1).status == S.PUBLISHED

    renewed = leases.acquire(LEADER, "a/1", 30)  # renewed by its holder: the same term leads again
    assert renewed.term == again.term
    assert store.versions.start_canary(v1, term=renewed.term).status == S.CANARY


def test_fenced_names_the_holder_when_given(store):
    term = store.fleet.leases.acquire(LEADER, "a/1", 30).term
    with store.db.write_session.begin() as s:
        fenced(s, term, "a/1")
    with pytest.raises(StaleLeader, match="held by a/1"):
        with store.db.write_session.begin() as s:
            fenced(s, term, "b/1")


def test_a_takeover_waits_for_a_fenced_transaction(store, store_url):
    """The check and the write are one transaction: a takeover that comes while it runs (the lease
    expiring meanwhile) waits for its commit, so nobody leads in a newer term before it is written."""
    other = Store(StoreConfig(url=store_url))  # another replica's connections
    try:
        leases, rival = store.fleet.leases, other.fleet.leases
        term = leases.acquire(LEADER, "old/1", LEASE).term
        taken: list[tuple[float, int]] = []
        done_at: list[float] = []

        def take_over() -> None:
            while True:
                state = rival.acquire(LEADER, "new/1", 30)
                if state.held:
                    taken.append((time.monotonic(), state.term))
                    return
                time.sleep(0.05)

        with store.db.write_session.begin() as s:
            fenced(s, term)
            thread = threading.Thread(target=take_over)
            thread.start()
            time.sleep(LEASE + 0.5)  # past the lease's expiry, inside the fenced transaction
            assert not taken  # the rival waits on the lease row (PostgreSQL) or the write lock (SQLite)
            done_at.append(time.monotonic())
        thread.join(30)
        assert taken and taken[0][0] >= done_at[0] and taken[0][1] == term + 1
    finally:
        other.close()
