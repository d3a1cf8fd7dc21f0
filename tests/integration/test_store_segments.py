"""Per-segment adapter lineages in the store, on real SQLite and PostgreSQL: versions and responses
carry their segment, queries and rollbacks stay inside one lineage (the base weights' or one
segment's adapters), and a segment's learner reads only its segment's ratings."""

import pytest

from liveloop.store import FeedbackRecord, ResponseRecord, RollbackRefused, Store, VersionStatus


def _response(i: int, version: int, segment: str | None) -> ResponseRecord:
    return ResponseRecord(
        id=f"r-{i}", api_key_id="k", model="m", policy_version=version, endpoint="chat",
        prompt_ids=(1, 2), response_ids=(3, 4), behavior_logprobs=(-0.5, -0.25), finish_reason="stop",
        temperature=1.0, top_p=1.0, latency_ms=1.0, segment=segment,
    )


def _publish(store: Store, version: int, parent: int, segment: str | None, serve: bool = True) -> None:
    store.versions.publish_version(
        version, parent=parent, checkpoint_path=f"/ckpt/{version}", checkpoint_sha256="0" * 64, learner_step=version,
        samples_used=1, metrics={}, cursor_name=f"sao:{segment}" if segment else "sao", last_feedback_id=0, segment=segment,
    )
    if serve:
        store.versions.activate_version(version)  # what the server's watcher does once the engine serves it


@pytest.fixture
def lineages(store):
    """Base v0; cozy's adapters 1 -> 3 -> 5 (5 serving); night's 2 -> 4 (4 serving)."""
    store.versions.ensure_base_version("/base")
    _publish(store, 1, 0, "cozy")
    _publish(store, 2, 0, "night")
    _publish(store, 3, 1, "cozy")
    _publish(store, 4, 2, "night")
    _publish(store, 5, 3, "cozy")
    return store


def test_queries_stay_inside_one_lineage(lineages):
    store = lineages
    assert store.versions.latest_version().version == 0  # the base weights' serving version
    assert store.versions.latest_version(segment="cozy").version == 5
    assert {s: r.version for s, r in store.versions.serving_adapters().items()} == {"cozy": 5, "night": 4}
    assert store.versions.get_version(4).segment == "night" and store.versions.get_version(0).segment is None
    _publish(store, 6, 4, "night", serve=False)
    assert [r.version for r in store.versions.versions_with_status(VersionStatus.PUBLISHED)] == []  # the base has none
    assert [r.version for r in store.versions.versions_with_status(VersionStatus.PUBLISHED, 4, segment="night")] == [6]
    assert store.versions.versions_with_status(VersionStatus.PUBLISHED, segment="cozy") == []


def test_rollback_moves_one_segment_only(lineages):
    store = lineages
    assert store.versions.rollback_to(3, "sao:cozy") == [5]
    statuses = {v.version: v.status for v in store.versions.list_versions()}
    assert statuses == {0: "serving", 1: "retired", 2: "retired", 3: "serving", 4: "serving", 5: "rolled_back"}
    assert store.versions.cursor_version("sao:cozy") == 3 and store.versions.cursor_version("sao:night") == 4
    assert store.operator.events()[-1].detail["segment"] == "cozy"


def test_a_segment_rolls_back_to_the_base(lineages):
    store = lineages
    assert store.versions.rollback_to(0, "sao:night", segment="night") == [2, 4]  # all of its lineage after the base
    assert "night" not in store.versions.serving_adapters()
    assert store.versions.get_version(0).status == "serving" and store.versions.get_version(5).status == "serving"
    assert store.versions.cursor_version("sao:night") == 0


def test_a_rollback_across_lineages_is_refused(lineages):
    with pytest.raises(RollbackRefused, match="cozy"):
        lineages.versions.rollback_to(4, "sao:cozy", segment="cozy")
    assert lineages.versions.get_version(5).status == "serving"


def test_a_segment_reads_only_its_own_ratings(store):
    store.versions.ensure_base_version("/base")
    segments = ["cozy", "night", None, "cozy", "night", "cozy"]
    store.feedback.insert_responses([_response(i, 0, seg) for i, seg in enumerate(segments)])
    for i in range(len(segments)):
        store.feedback.put_feedback(FeedbackRecord(f"r-{i}", "k", i % 2))
    cozy = store.feedback.rated_after(0, 10, segment="cozy")
    assert [r.id for _, r in cozy] == ["r-0", "r-3", "r-5"] and {r.segment for _, r in cozy} == {"cozy"}
    assert [r.id for _, r in store.feedback.rated_after(cozy[0][0].id, 10, segment="cozy")] == ["r-3", "r-5"]
    assert len(store.feedback.rated_after(0, 10)) == 6  # no segment: every rating (the shared policy)
