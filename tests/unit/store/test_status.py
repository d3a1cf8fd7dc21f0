"""The version statuses: the strings the column and the API hold, and the groups the rules use."""

import json

from liveloop.store import VersionStatus
from liveloop.store.status import NEVER_PRUNED, NOT_ROLLED_BACK, UNSERVABLE

# the values in databases written before the enum existed, and in the API's JSON: never renamed
STORED = {"loading", "published", "candidate", "serving", "retired", "superseded", "rolled_back", "failed", "canary", "held"}


def test_values_are_the_stored_strings_and_fit_the_column():
    assert {s.value for s in VersionStatus} == STORED
    assert all(len(s.value) <= 16 for s in VersionStatus)  # policy_versions.status is VARCHAR(16)
    assert VersionStatus("rolled_back") is VersionStatus.ROLLED_BACK and VersionStatus.SERVING == "serving"
    assert f"{VersionStatus.ROLLED_BACK}" == "rolled_back" and json.dumps([VersionStatus.FAILED]) == '["failed"]'


def test_groups():
    assert {s for s in VersionStatus if not s.servable} == UNSERVABLE == {VersionStatus.FAILED, VersionStatus.LOADING}
    assert NEVER_PRUNED == {VersionStatus.SERVING, VersionStatus.LOADING, VersionStatus.PUBLISHED, VersionStatus.CANARY}
    assert VersionStatus.HELD.servable and VersionStatus.CANARY.servable  # an operator may roll back to a held one
    assert UNSERVABLE < NOT_ROLLED_BACK and VersionStatus.ROLLED_BACK in NOT_ROLLED_BACK
    assert "serving" in NEVER_PRUNED  # plain strings are found in the groups too
    assert all(s.description for s in VersionStatus)


def test_the_transition_table():
    from liveloop.store.status import ACTIVATABLE, TRANSITIONS, TransitionRefused, check_transition

    assert set(TRANSITIONS) == set(VersionStatus)  # every status has its row
    assert TRANSITIONS[VersionStatus.FAILED] == frozenset()  # final
    # any -> failed; any that served or waited -> rolled back (NOT_ROLLED_BACK never is)
    assert all(VersionStatus.FAILED in TRANSITIONS[s] for s in VersionStatus if s is not VersionStatus.FAILED)
    assert {s for s in VersionStatus if VersionStatus.ROLLED_BACK in TRANSITIONS[s]} == set(VersionStatus) - NOT_ROLLED_BACK
    # nothing unservable is ever served by a rollback; activation serves only what waits to load
    assert {s for s in VersionStatus if VersionStatus.SERVING in TRANSITIONS[s]} == set(VersionStatus) - {VersionStatus.FAILED, VersionStatus.SERVING}
    assert ACTIVATABLE == {VersionStatus.PUBLISHED, VersionStatus.LOADING, VersionStatus.CANARY}  # promotion activates a canary
    assert VersionStatus.SUPERSEDED in TRANSITIONS[VersionStatus.PUBLISHED]
    # the release gate: published -> canary -> serving (promoted) | held; a published one may be held too
    assert {VersionStatus.CANARY, VersionStatus.HELD} <= TRANSITIONS[VersionStatus.PUBLISHED]
    assert TRANSITIONS[VersionStatus.CANARY] == {
        VersionStatus.SERVING, VersionStatus.HELD, VersionStatus.SUPERSEDED, VersionStatus.ROLLED_BACK, VersionStatus.FAILED
    }
    assert TRANSITIONS[VersionStatus.HELD] == {VersionStatus.SERVING, VersionStatus.ROLLED_BACK, VersionStatus.FAILED}
    assert not any(VersionStatus.CANARY in TRANSITIONS[s] for s in VersionStatus if s is not VersionStatus.PUBLISHED)
    check_transition(1, VersionStatus.PUBLISHED, VersionStatus.SERVING)
    try:
        check_transition(1, VersionStatus.FAILED, VersionStatus.SERVING)
    except TransitionRefused as exc:
        assert "version 1 is failed" in str(exc)
    else:
        raise AssertionError("failed -> serving was allowed")
