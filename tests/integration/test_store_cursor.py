"""`store.versions.advance_cursor` on real SQLite and PostgreSQL: a learner whose steps since its last version were
all skipped moves only its cursor, in one transaction with the lineage check a publish makes."""

import pytest

from liveloop.store import StaleLineage, Store


def _publish(store: Store, version: int, parent: int, cursor: int) -> None:
    store.versions.publish_version(
        version, parent=parent, checkpoint_path=f"/ckpt/{version}", checkpoint_sha256="0" * 64, learner_step=version,
        samples_used=1, metrics={}, cursor_name="sao", last_feedback_id=cursor,
    )


def test_the_cursor_moves_on_the_same_version(store):
    store.versions.advance_cursor("sao", 5, 0)  # no cursor row yet: created on version 0
    assert (store.feedback.get_cursor("sao"), store.versions.cursor_version("sao")) == (5, 0)
    _publish(store, 1, parent=0, cursor=6)
    store.versions.advance_cursor("sao", 9, 1)
    assert (store.feedback.get_cursor("sao"), store.versions.cursor_version("sao")) == (9, 1)
    assert [v.version for v in store.versions.list_versions()] == [0, 1]  # no version row


def test_a_moved_lineage_is_refused_and_nothing_changes(store):
    _publish(store, 1, parent=0, cursor=3)
    with pytest.raises(StaleLineage, match="lineage is now 1"):
        store.versions.advance_cursor("sao", 7, 0)  # the learner still thinks it is on version 0
    assert (store.feedback.get_cursor("sao"), store.versions.cursor_version("sao")) == (3, 1)
