"""The typed results and refusals of a change of what serves (server/control/activator.py, rollback.py,
watcher.py): what a swap or a rollback did, and the domain exceptions the HTTP edge maps to statuses
(server/edge/errors.py) and the background guard logs. The store's own refusals (`TransitionRefused`,
`RollbackRefused`, `ServingChanged`, `VersionNotFound`) stay the store's."""

from __future__ import annotations

from dataclasses import dataclass

from liveloop.segments import BASE, Lineage


class CheckpointUnusable(ValueError):
    """The directory an operator asked to publish is not a checkpoint the engine can load."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


class NotServable(RuntimeError):
    """A stored version cannot be swapped in: it never loaded, has no weights, or retention deleted them."""


class AlreadyServing(RuntimeError):
    """The version asked for is the one serving."""


class SwapFailed(RuntimeError):
    """The engine could not load a version's weights (the old version keeps serving)."""

    def __init__(self, version: int, message: str):
        super().__init__(message)
        self.version = version


class UnknownSegment(LookupError):
    """A segment this server has no adapter lineage for (adapters are off, or it is not configured)."""


@dataclass(frozen=True)
class SwapResult:
    """A version swapped in: which, on top of which, how long the swap took and held requests."""

    version: int
    parent: int
    swap_ms: float
    held_ms: float


@dataclass(frozen=True)
class RollbackResult:
    """A stored version served again: the one it replaced and the versions marked rolled back (for a
    segment's adapters: `lineage` names it, and `previous` was its adapter version or the base's)."""

    version: int
    previous: int
    rolled_back: list[int]
    swap_ms: float
    held_ms: float
    lineage: Lineage = BASE
