"""The store's operator queries on real SQLite and PostgreSQL: pause, rollback in one transaction,
the lineage check that stops a learner publishing past a rollback, and the drift monitor's reads."""

import dataclasses
from datetime import timedelta

import pytest

from liveloop.store import FeedbackRecord, ResponseRecord, RollbackRefused, StaleLineage, Store
from liveloop.store.models import utcnow


def _response(i: int, version: int, topic: str = "cats") -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}", api_key_id="k", model="m", policy_version=version, endpoint="chat",
        prompt_ids=(1, 2), response_ids=(3, 4), behavior_logprobs=(-0.5, -0.25), finish_reason="stop",
        temperature=1.0, top_p=1.0, latency_ms=1.0, request_meta={"topic": topic},
    )


def _publish(store: Store, version: int, parent: int, cursor: int = 0) -> None:
    store.versions.publish_version(
        version, parent=parent, checkpoint_path=f"/ckpt/{version}", checkpoint_sha256="0" * 64, learner_step=version,
        samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=cursor,
    )
    store.versions.activate_version(version)  # what the server's watcher does once the engine serves it


def test_pause_and_resume_are_logged_once(store):
    assert not store.operator.learning_paused("sao")
    assert store.operator.set_learning_paused("sao", True, "looking at v3", api_key_id="admin")
    assert not store.operator.set_learning_paused("sao", True)  # already paused: no change, no event
    assert store.operator.learning_paused("sao")
    assert store.operator.set_learning_paused("sao", False)
    assert [(e.kind, e.api_key_id) for e in store.operator.events()] == [("pause", "admin"), ("resume", None)]


def test_rollback_marks_versions_and_moves_the_lineage(store):
    for v in (1, 2, 3):
        _publish(store, v, v - 1, cursor=10 * v)
    rolled = store.versions.rollback_to(1, "sao", api_key_id="admin", reason="v3 is worse")
    assert rolled == [2, 3]
    assert {v.version: v.status for v in store.versions.list_versions()} == {0: "retired", 1: "serving", 2: "rolled_back", 3: "rolled_back"}
    assert store.versions.cursor_version("sao") == 1 and store.feedback.get_cursor("sao") == 30  # consumed ratings stay consumed
    assert store.versions.latest_version().version == 1  # what a restarted server serves
    # the learner that was about to publish v4 on top of v3 is refused; on top of v1 it may
    with pytest.raises(StaleLineage):
        _publish(store, 4, 3)
    assert store.versions.get_version(4) is None
    _publish(store, 4, 1)
    event = store.operator.events()[-1]
    assert (event.kind, event.version, event.detail["rolled_back"]) == ("rollback", 1, [2, 3])


def test_rollback_forward_to_a_rolled_back_version_and_refusals(store):
    _publish(store, 1, 0)
    _publish(store, 2, 1)
    store.versions.rollback_to(0, "sao")
    assert store.versions.rollback_to(2, "sao") == []  # undo: 2 serves again; 0 is retired
    assert {v.version: v.status for v in store.versions.list_versions()} == {0: "retired", 1: "rolled_back", 2: "serving"}
    store.versions.add_version(3, parent=2, checkpoint_path="/x", status="failed")
    with pytest.raises(RollbackRefused, match="failed"):
        store.versions.rollback_to(3, "sao")
    with pytest.raises(RollbackRefused, match="unknown"):
        store.versions.rollback_to(42, "sao")


def test_rollback_without_a_learner_cursor_starts_it_at_the_newest_rating(store):
    store.feedback.insert_responses([_response(1, 0)])
    store.feedback.put_feedback(FeedbackRecord("r-1", "k", 1))
    store.versions.add_version(1, parent=0, checkpoint_path="/x", status="serving")
    store.versions.rollback_to(0, "sao")
    assert store.feedback.get_cursor("sao") == store.feedback.last_rating_id() > 0


def test_monitor_reads(store):
    _publish(store, 1, 0)
    store.feedback.insert_responses([_response(i, 0 if i < 6 else 1, "cats" if i % 2 else "dogs") for i in range(10)])
    for i in range(8):  # v0: r-0..5 rated (4 up), v1: r-6, r-7 rated (0 up)
        store.feedback.put_feedback(FeedbackRecord(f"r-{i}", "k", int(i in (0, 1, 2, 4))))
    traffic = store.release.version_traffic()
    assert (traffic[0].responses, traffic[0].ratings, traffic[0].positive) == (6, 6, 4)
    assert (traffic[1].responses, traffic[1].ratings, traffic[1].positive) == (4, 2, 0)
    events = store.feedback.rating_events()
    assert [e.policy_version for e in events] == [0] * 6 + [1] * 2
    assert events[1].request_meta == {"topic": "cats"} and events[0].reward == 1
    assert [e.feedback_id for e in store.feedback.rating_events(after_id=events[5].feedback_id, limit=1)] == [events[6].feedback_id]
    assert store.feedback.last_rating_id(skip=2) == events[5].feedback_id
    assert store.feedback.rating_events(since=utcnow() + timedelta(hours=1)) == []
    buckets = store.feedback.responses_per_bucket(utcnow() - timedelta(hours=1), 3600)
    assert sum(buckets.values()) == 10 and all(b % 3600 == 0 for b in buckets)


def test_version_traffic_counts_one_vote_per_key(store):
    """A key that rates many replies is one vote (its positive share); a quarantined key's vote is left
    out of the trusted view."""
    _publish(store, 1, 0)
    raters = ["loud"] * 8 + ["a", "b", "c", "c"]  # loud: 8 ratings, 2 up; a up; b down; c 1 of 2 up
    store.feedback.insert_responses([dataclasses.replace(_response(i, 0), api_key_id=key) for i, key in enumerate(raters)])
    rewards = [1, 1, 0, 0, 0, 0, 0, 0] + [1, 0, 1, 0]
    for i, (key, reward) in enumerate(zip(raters, rewards)):
        store.feedback.put_feedback(FeedbackRecord(f"r-{i}", key, reward))
    t = store.release.version_traffic()[0]
    assert (t.ratings, t.positive, t.keys) == (12, 4, 4)
    assert t.votes == pytest.approx(2 / 8 + 1 + 0 + 1 / 2)
    assert store.keys.set_quarantined("loud", True, "test")
    trusted = store.release.version_traffic(trusted=True)[0]
    assert (trusted.ratings, trusted.positive, trusted.keys) == (4, 2, 3) and trusted.votes == pytest.approx(1.5)
