"""Migration 0006 on real SQLite and real PostgreSQL: a live database at 0005 is upgraded in place (its
version rows kept, their nonce and digest NULL), gets a random deployment id that two databases never
share (whatever their URLs), and goes back down to 0005 cleanly. Version rows carry what a transport's
handle names; `reject_weights` fails a version being activated with an operator event."""

import pytest
from sqlalchemy import inspect, text

from liveloop.store import Store, StoreConfig, VersionStatus
from liveloop.store import migrate


def _columns(s: Store) -> set[str]:
    return {c["name"] for c in inspect(s.engine).get_columns("policy_versions")}


def test_upgrade_from_0005_keeps_rows_and_makes_a_deployment_id(store_url):
    s = Store(StoreConfig(url=store_url))
    assert migrate.upgrade(s.engine, "0005") == "0005"
    with s.engine.begin() as conn:  # a version row written by the code before digests
        conn.execute(text(
            "INSERT INTO policy_versions (version, parent, created_at, checkpoint_path, learner_step, samples_used, metrics, status, pinned) "
            "VALUES (0, NULL, CURRENT_TIMESTAMP, '/models/base', 0, 0, '{}', 'serving', false)"
        ))
    assert "weights_digest" not in _columns(s)

    assert migrate.upgrade(s.engine, "0006") == "0006"
    assert {"weights_nonce", "weights_digest"} <= _columns(s)
    base = s.versions.get_version(0)
    assert base.checkpoint_path == "/models/base" and base.weights_nonce is None and base.weights_digest is None
    ident = s.fleet.deployment_id()
    assert len(ident) == 32 and int(ident, 16) >= 0 and s.fleet.deployment_id() == ident  # made once, by the migration

    assert migrate.downgrade(s.engine, "0005") == "0005"
    assert "deployment" not in inspect(s.engine).get_table_names() and "weights_digest" not in _columns(s)
    with s.engine.connect() as conn:  # (the model has columns 0005 lacks: read through SQL)
        assert conn.execute(text("SELECT checkpoint_path FROM policy_versions WHERE version = 0")).scalar_one() == "/models/base"
    s.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_two_databases_get_two_ids(store_url, tmp_path):
    a, b = Store(StoreConfig(url=store_url)), Store(StoreConfig(url=f"sqlite:///{tmp_path / 'other.db'}"))
    a.migrate(), b.migrate()
    assert a.fleet.deployment_id() != b.fleet.deployment_id()
    a.close(), b.close()


def test_rows_carry_the_handles_nonce_and_digest_and_a_rejection_fails_the_version(store):
    store.versions.add_version(1, parent=0, checkpoint_path="/c/v1", status=VersionStatus.PUBLISHED, weights_nonce="n" * 32, weights_digest="d" * 64)
    record = store.versions.get_version(1)
    assert (record.weights_nonce, record.weights_digest) == ("n" * 32, "d" * 64)
    v2 = store.versions.publish_version(
        parent=1, checkpoint_path="/c/v2", checkpoint_sha256=None, learner_step=2, samples_used=1, metrics={},
        cursor_name="sao", last_feedback_id=0, weights_nonce="m" * 32, weights_digest="e" * 64,
    )
    assert (v2.weights_nonce, v2.weights_digest) == ("m" * 32, "e" * 64)

    assert store.versions.reject_weights(1, {"reason": "digest mismatch"}) is True
    assert store.versions.get_version(1).status == VersionStatus.FAILED
    (event,) = [e for e in store.operator.events() if e.kind == "weights_rejected"]
    assert event.version == 1 and event.detail == {"reason": "digest mismatch", "failed": True}
    assert store.versions.reject_weights(0, {"reason": "x"}) is False  # the serving version is left to the publisher
    assert store.versions.get_version(0).status == VersionStatus.SERVING
