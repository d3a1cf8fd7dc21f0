"""The policy-version statuses: one `VersionStatus` enum, the only place their names are spelled, and
the groups of statuses the rules of the store, the server and retention are written in.

A version's life: an operator's publish writes its row as LOADING while the engine swaps it in; a
learner writes PUBLISHED (offline replay: CANDIDATE, which the server never activates on its own).
Activation makes it SERVING and its parent RETIRED; a published version overtaken by a newer one
before activation becomes SUPERSEDED; a swap that fails marks it FAILED; a rollback marks every later
version that served or waited ROLLED_BACK. Under a release gate (`[release] mode` canary or gated,
liveloop.release) a published version becomes the lineage's one CANARY while the gate tries it (a
fraction of users in canary mode, none in gated mode, while its evaluation runs); promotion is its
activation, and a candidate the gate refuses is HELD (it stays servable: an operator may overrule the
gate by rolling back to it). The values are the strings the `policy_versions.status`
column holds and the API returns (a `StrEnum`: members compare equal to, and serialise as, them).

`TRANSITIONS` is the table of legal moves: the store's version-state methods (store/versions.py) check
every status they write against it, inside their transaction, and refuse the rest (`TransitionRefused`).
published -> (candidate | canary ->) serving -> retired; published | canary -> held; any ->
rolled_back / failed. A rolled-back version
serves again only when an operator rolls back to it; the activation path takes `ACTIVATABLE` only.
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
    CANARY = "canary"
    HELD = "held"

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
NEVER_PRUNED = frozenset({VersionStatus.SERVING, VersionStatus.LOADING, VersionStatus.PUBLISHED, VersionStatus.CANARY})
# a rollback leaves these alone: rows that never served, or were already rolled back
NOT_ROLLED_BACK = frozenset({VersionStatus.FAILED, VersionStatus.LOADING, VersionStatus.ROLLED_BACK})

# what activation (the publisher's watcher, an operator's publish) may make SERVING: a learner's fresh
# version, an operator's checkpoint being loaded, or the gate's candidate (promotion); nothing rolled
# back, failed, superseded or held
ACTIVATABLE = frozenset({VersionStatus.PUBLISHED, VersionStatus.LOADING, VersionStatus.CANARY})


class VersionNotFound(LookupError):
    """No policy version with this number."""


class TransitionRefused(RuntimeError):
    """A version-state change the store refuses: the move is not in `TRANSITIONS`, or the version is
    not (or no longer) on its lineage, or something newer serves. Nothing was written."""


_S = VersionStatus
TRANSITIONS: dict[VersionStatus, frozenset[VersionStatus]] = {
    _S.LOADING: frozenset({_S.SERVING, _S.FAILED}),
    _S.PUBLISHED: frozenset({_S.SERVING, _S.SUPERSEDED, _S.ROLLED_BACK, _S.FAILED, _S.CANARY, _S.HELD}),
    _S.CANDIDATE: frozenset({_S.SERVING, _S.ROLLED_BACK, _S.FAILED}),
    _S.SERVING: frozenset({_S.RETIRED, _S.ROLLED_BACK, _S.FAILED}),
    _S.RETIRED: frozenset({_S.SERVING, _S.ROLLED_BACK, _S.FAILED}),
    _S.SUPERSEDED: frozenset({_S.SERVING, _S.ROLLED_BACK, _S.FAILED}),
    _S.ROLLED_BACK: frozenset({_S.SERVING, _S.FAILED}),  # serving again: an operator's rollback to it only
    _S.FAILED: frozenset(),  # final
    _S.CANARY: frozenset({_S.SERVING, _S.HELD, _S.SUPERSEDED, _S.ROLLED_BACK, _S.FAILED}),  # serving: promotion
    _S.HELD: frozenset({_S.SERVING, _S.ROLLED_BACK, _S.FAILED}),  # serving: an operator's rollback to it only
}


def check_transition(version: int, current: VersionStatus, new: VersionStatus) -> None:
    """Raise TransitionRefused unless `current -> new` is in TRANSITIONS."""
    if new not in TRANSITIONS[VersionStatus(current)]:
        raise TransitionRefused(f"version {version} is {current}: it cannot become {new}")


_DESCRIPTIONS = {
    VersionStatus.LOADING: "an operator's checkpoint being swapped in",
    VersionStatus.PUBLISHED: "published by a learner, waiting to be activated",
    VersionStatus.CANDIDATE: "published by an offline replay; an operator promotes it",
    VersionStatus.SERVING: "the version users are served",
    VersionStatus.RETIRED: "served before, replaced by a newer version",
    VersionStatus.SUPERSEDED: "published, but a newer version was activated first",
    VersionStatus.ROLLED_BACK: "undone by a rollback to an earlier version",
    VersionStatus.FAILED: "its weights could not be loaded",
    VersionStatus.CANARY: "the release gate's candidate: serving a fraction of users (canary) or none (gated) while it is evaluated",
    VersionStatus.HELD: "refused by the release gate (evaluation failed, rated worse, or a reward-hacking alarm); an operator may still roll back to it",
}
