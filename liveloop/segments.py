"""Which adapter segment a request belongs to, and the segments a learner trains.

`[learner] adapters` decides:
  - "none": no segment (the whole policy is trained on every rating);
  - "shared": one adapter for everyone, the segment "shared";
  - "segment": the request's `metadata[segment_key]` when it names one of `[learner] segments`, else
    "overflow": unknown, missing and over-the-bound values share one adapter, so the number of
    adapters is bounded by the operator's list, never by what clients send.
The server routes each request with `segment_of` and records the result with the response; the learner
trains each segment in `lanes` on the ratings of that segment's responses only. The rule is theirs
together, so it lives below both (neither `server/` nor `learner/` imports the other).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from liveloop.learner.config import LearnerConfig

OVERFLOW = "overflow"
SHARED = "shared"


def segment_of(metadata: Mapping[str, Any] | None, config: LearnerConfig) -> str | None:
    """The segment whose adapter serves a request with this metadata (None: adapters are off)."""
    if config.adapters == "none":
        return None
    if config.adapters == "shared":
        return SHARED
    name = (metadata or {}).get(config.segment_key)
    return name if isinstance(name, str) and name in config.segments else OVERFLOW


def lanes(config: LearnerConfig) -> tuple[str, ...]:
    """The segments with an adapter of their own, in training order."""
    if config.adapters == "none":
        return ()
    if config.adapters == "shared":
        return (SHARED,)
    return (*config.segments, OVERFLOW)


def lane_cursor(config: LearnerConfig, segment: str | None) -> str:
    """The learner_cursor (and learner_control) row of one segment's lineage: `sao:cozy`; the shared
    policy keeps the plain cursor name."""
    return config.cursor_name if segment is None else f"{config.cursor_name}:{segment}"
