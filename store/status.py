"""The policy-version statuses: one `VersionStatus` enum, the only place their names are spelled, and
the groups of statuses the rules of the store, the server and retention are written in.

A version's life: an operator's publish writes its row as LOADING while the engine swaps it in; a
learner writes PUBLISHED (offline replay: CANDIDATE, which the server never activates on its own).
Activation makes it SERVING and its parent RETIRED; a published version overtaken by a newer one
before activation becomes SUPERSEDED; a swap that fails marks it FAILED; a rollback marks every later
version that served or waited ROLLED_BACK. The values are the strings the `policy_versions.status`
column holds and the API returns (a `StrEnum`: members compare equal to, and serialise as, them).
"""

from __future__ import annotations

from enum import StrEnum


class VersionStatus(StrEnum):
    LOADING = "loading"
    PUBLISHED = "published"
    CANDIDATE = "candidate"
    SERVING = "serving"
    RETIRED = "retired"
    SUPERSEDED = "superseded"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"

    @property
    def servable(self) -> bool:
        """Whether a version in this status may be swapped in (by a rollback, or the dashboard's
        button): it has loaded once, or is waiting with complete weights."""
        return self not in UNSERVABLE

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


# never loaded successfully (or still loading): a rollback refuses them
UNSERVABLE = frozenset({VersionStatus.FAILED, VersionStatus.LOADING})
# serving or about to: retention never prunes their checkpoints
NEVER_PRUNED = frozenset({VersionStatus.SERVING, VersionStatus.LOADING, VersionStatus.PUBLISHED})
# a rollback leaves these alone: rows that never served, or were already rolled back
NOT_ROLLED_BACK = frozenset({VersionStatus.FAILED, VersionStatus.LOADING, VersionStatus.ROLLED_BACK})

_DESCRIPTIONS = {
    VersionStatus.LOADING: "an operator's checkpoint being swapped in",
    VersionStatus.PUBLISHED: "published by a learner, waiting to be activated",
    VersionStatus.CANDIDATE: "published by an offline replay; an operator promotes it",
    VersionStatus.SERVING: "the version users are served",
    VersionStatus.RETIRED: "served before, replaced by a newer version",
    VersionStatus.SUPERSEDED: "published, but a newer version was activated first",
    VersionStatus.ROLLED_BACK: "undone by a rollback to an earlier version",
    VersionStatus.FAILED: "its weights could not be loaded",
}
