"""The `[segments]` section, which adapter segment a request belongs to, and the segments a learner trains.

`[segments] adapters` decides:
  - "none": no segment (the whole policy is trained on every rating);
  - "shared": one adapter for everyone, the segment "shared";
  - "segment": the request's `metadata[key]` (`[server] segment_key`) when it names one of `[segments] names`,
    else "overflow": unknown, missing and over-the-bound values share one adapter, so the number of
    adapters is bounded by the operator's list, never by what clients send.
The server routes each request with `segment_of` and records the result with the response; the learner
trains each segment in `lanes` on the ratings of that segment's responses only. The rule and its
section are theirs together, so they live below both (neither `server/` nor `learner/` imports the
other); both keys were `[learner]`'s (an older file still loads: liveloop/config.py `MOVED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from liveloop.config_types import check_literals

OVERFLOW = "overflow"
SHARED = "shared"
SEGMENT_KEY = "segment"  # the request metadata key that names a segment, unless `[server] segment_key` says another


@dataclass(frozen=True)
class SegmentsConfig:
    """`[segments]`: which adapters serve and train, and the segments with one of their own."""

    adapters: Literal["none", "segment", "shared"] = field(
        default="none",
        metadata={"help": "none: the whole policy serves and trains; segment: a LoRA adapter per segment on one frozen "
                  "base, each trained on its segment's ratings only; shared: one LoRA adapter for everyone "
                  "(the adapters' shape: [learner.lora])"},
    )
    names: tuple[str, ...] = field(
        default=(),
        metadata={"help": "adapters = segment: the segments with their own adapter (the request metadata key [server] "
                  "segment_key names one); any other value, or none, is served and trained as the shared 'overflow' segment"},
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if len(set(self.names)) != len(self.names) or {OVERFLOW, SHARED, "base"} & set(self.names):
            raise ValueError("names must be distinct and may not be 'overflow', 'shared' or 'base'")
        if any(not name or len(name) > 64 or ":" in name for name in self.names):
            raise ValueError("names must be 1-64 characters without ':'")


def segment_of(metadata: Mapping[str, Any] | None, config: SegmentsConfig, key: str = SEGMENT_KEY) -> str | None:
    """The segment whose adapter serves a request with this metadata (None: adapters are off); `key` is
    the metadata key that names it (`[server] segment_key`)."""
    if config.adapters == "none":
        return None
    if config.adapters == "shared":
        return SHARED
    name = (metadata or {}).get(key)
    return name if isinstance(name, str) and name in config.names else OVERFLOW


def lanes(config: SegmentsConfig) -> tuple[str, ...]:
    """The segments with an adapter of their own, in training order."""
    if config.adapters == "none":
        return ()
    if config.adapters == "shared":
        return (SHARED,)
    return (*config.names, OVERFLOW)


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
