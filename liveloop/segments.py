"""Which adapter segment a request belongs to, and the segments a learner trains.

`[learner] adapters` decides:
  - "none": no segment (the whole policy is trained on every rating);
  - "shared": one adapter for everyone, the segment "shared";
  - "segment": the request's `metadata[key]` (`[server] segment_key`) when it names one of `[learner] segments`, else
    "overflow": unknown, missing and over-the-bound values share one adapter, so the number of
    adapters is bounded by the operator's list, never by what clients send.
The server routes each request with `segment_of` and records the result with the response; the learner
trains each segment in `lanes` on the ratings of that segment's responses only. The rule is theirs
together, so it lives below both (neither `server/` nor `learner/` imports the other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from liveloop.learner.config import LearnerConfig

OVERFLOW = "overflow"
SHARED = "shared"
SEGMENT_KEY = "segment"  # the request metadata key that names a segment, unless `[server] segment_key` says another


def segment_of(metadata: Mapping[str, Any] | None, config: LearnerConfig, key: str = SEGMENT_KEY) -> str | None:
    """The segment whose adapter serves a request with this metadata (None: adapters are off); `key` is
    the metadata key that names it (`[server] segment_key`)."""
    if config.adapters == "none":
        return None
    if config.adapters == "shared":
        return SHARED
    name = (metadata or {}).get(key)
    return name if isinstance(name, str) and name in config.segments else OVERFLOW


def lanes(config: LearnerConfig) -> tuple[str, ...]:
    """The segments with an adapter of their own, in training order."""
    if config.adapters == "none":
        return ()
    if config.adapters == "shared":
        return (SHARED,)
    return (*config.segments, OVERFLOW)


class _Segmented(Protocol):
    segment: str | None


@dataclass(frozen=True)
class Lineage:
    """What a policy version belongs to: the base weights (`segment` None) or one segment's adapter over
    them. Each lineage has its own line of versions, its own serving version, its own learner cursor
    and pause (its `lane`: `sao`, `sao:cozy`), and rolls back alone."""

    segment: str | None = None

    @classmethod
    def of(cls, version: _Segmented) -> Lineage:
        """The lineage of a version row (anything with a `segment`)."""
        return cls(version.segment)

    @property
    def is_base(self) -> bool:
        return self.segment is None

    def lane(self, cursor_name: str) -> str:
        """The learner_cursor (and learner_control) row that names this lineage."""
        return cursor_name if self.segment is None else f"{cursor_name}:{self.segment}"

    def __str__(self) -> str:
        return "the base weights" if self.segment is None else f"segment {self.segment!r}"


BASE = Lineage()


def lane_cursor(config: LearnerConfig, segment: str | None) -> str:
    """The learner_cursor (and learner_control) row of one segment's lineage: `sao:cozy`; the shared
    policy keeps the plain cursor name."""
    return Lineage(segment).lane(config.cursor_name)
