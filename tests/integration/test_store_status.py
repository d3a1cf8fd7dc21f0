"""The status column on real SQLite and PostgreSQL: every `VersionStatus` goes in and comes back as the
member (whatever path wrote it: a row, an update, a rollback), rows written as plain strings read back
as members, and a status that is not one is refused before it reaches the database."""

import pytest
from sqlalchemy import text
from sqlalchemy.exc import StatementError

from liveloop.store import VersionStatus


def test_every_status_round_trips_as_the_member(store):
    for i, status in enumerate(VersionStatus, start=1):
        store.versions.add_version(i, parent=0, checkpoint_path=f"/ckpt/{i}", status=status)
    by_version = {v.version: v.status for v in store.versions.list_versions()}
    assert [by_version[i] for i in range(1, len(VersionStatus) + 1)] == list(VersionStatus)
    assert all(type(s) is VersionStatus for s in by_version.values())
    assert [v.version for v in store.versions.versions_with_status(VersionStatus.CANDIDATE)] == [3]
    with store.engine.connect() as conn:  # the column holds the plain strings
        assert conn.execute(text("SELECT status FROM policy_versions WHERE version = 7")).scalar() == "rolled_back"


def test_plain_strings_are_read_as_members_and_unknown_ones_refused(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/ckpt/1", status="published")
    store.versions.activate_version(1)
    assert store.versions.get_version(1).status is VersionStatus.SERVING
    assert store.versions.latest_version().version == 1
    with pytest.raises((StatementError, ValueError)):
        store.versions.add_version(2, parent=1, checkpoint_path="/ckpt/2", status="promoted")
    assert [v.version for v in store.versions.list_versions()] == [0, 1] and store.versions.get_version(1).status is VersionStatus.SERVING


def test_rollback_writes_members(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/ckpt/1", status=VersionStatus.PUBLISHED)
    store.versions.activate_version(1)
    store.versions.add_version(2, parent=1, checkpoint_path="/ckpt/2", status=VersionStatus.PUBLISHED)
    store.versions.add_version(3, parent=1, checkpoint_path="/ckpt/3", status=VersionStatus.FAILED)
    assert store.versions.rollback_to(0, "sao") == [1, 2]
    assert [v.status for v in store.versions.list_versions()] == [
        VersionStatus.SERVING, VersionStatus.ROLLED_BACK, VersionStatus.ROLLED_BACK, VersionStatus.FAILED,
    ]
