"""Influence caps: how much one API key can steer the policy (`[learner] max_per_key_per_batch`,
`max_per_key_per_window`, `influence_window_seconds`).

The learner reads ratings in arrival order.
  - Per step: a policy step holds at most `per_batch` samples of one key while another key's rating
    waits. A rating that would exceed it ends the step there (`full_for`); it opens the next step.
    Deferred, never dropped. With `lone_key_batches` a key whose ratings are the only ones waiting has
    no share to keep (nobody else's rating is held back by it): its ratings fill the step up to the
    batch size, so one user, or an app that rates through one key, trains in batches too.
  - Per window: a rating is trained only if its key has fewer than `per_window` trained samples whose
    rating time lies in the window (t - window_seconds, t], t being this rating's `created_at`
    (`per_window` = 0: no window cap). A rating over it is skipped: the learner's cursor moves past it
    and it is never trained later (it stays stored and counted).

    caps = InfluenceCaps(InfluenceLimits.from_config(config))
    plan = caps.plan()                       # one policy step being built
    for rating in ratings: plan.offer(rating)   # True: in the batch; False: capped
    caps.commit(plan)                        # the batch is consumed: remember what was trained

State: the window (per key, the feedback id and time of each sample trained inside it) lives in
memory only. A restarted learner rebuilds it from nothing, so right after a restart a key can get up to
one more window's worth of trained samples. No store query makes it exact: the store does not record
which ratings were capped. After a rollback the learner re-reads ratings past its stored cursor; the
entries of those ratings are dropped (`forget_after`) so they are judged again, not counted twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InfluenceLimits:
    per_batch: int = 1  # >= 1
    per_window: int = 20  # 0 = no window cap
    window_seconds: float = 3600.0
    lone_key_batches: bool = False  # a key alone in the queue fills the step (per_batch binds only while others wait)

    @classmethod
    def from_config(cls, config: Any) -> "InfluenceLimits":
        return cls(config.max_per_key_per_batch, config.max_per_key_per_window, config.influence_window_seconds,
                   config.lone_key_batches)


@dataclass(frozen=True)
class KeyedRating:
    """What the caps look at: which rating, whose key, when (unix seconds)."""

    feedback_id: int
    key_id: str
    at: float


@dataclass
class BatchPlan:
    """One policy step being built; `offer` ratings in arrival order."""

    caps: "InfluenceCaps"
    admitted: list[KeyedRating] = field(default_factory=list)
    capped_batch: int = 0
    capped_window: int = 0
    _per_key: dict[str, int] = field(default_factory=dict)

    def full_for(self, key_id: str, others_wait: bool = True) -> bool:
        """This step already holds its `per_batch` samples of `key_id`: end the step before its next rating
        (with `lone_key_batches`, only while `others_wait`: another key's rating is waiting behind it)."""
        if not others_wait and self.caps.limits.lone_key_batches:
            return False
        return self._per_key.get(key_id, 0) >= self.caps.limits.per_batch

    def offer(self, rating: KeyedRating, others_wait: bool = True) -> bool:
        """True: the rating goes into this batch; False: it is over a cap (skipped)."""
        limits = self.caps.limits
        if self.full_for(rating.key_id, others_wait):
            self.capped_batch += 1
            return False
        if limits.per_window and self._in_window(rating) >= limits.per_window:
            self.capped_window += 1
            return False
        self._per_key[rating.key_id] = self._per_key.get(rating.key_id, 0) + 1
        self.admitted.append(rating)
        return True

    def _in_window(self, rating: KeyedRating) -> int:
        start = rating.at - self.caps.limits.window_seconds
        trained = self.caps.trained.get(rating.key_id, ())
        here = (r for r in self.admitted if r.key_id == rating.key_id)
        return sum(1 for r in trained if start < r.at <= rating.at) + sum(1 for r in here if start < r.at <= rating.at)

    @property
    def capped(self) -> int:
        return self.capped_batch + self.capped_window


class InfluenceCaps:
    """The per-key window of trained samples and the cumulative capped counters."""

    def __init__(self, limits: InfluenceLimits):
        if limits.per_batch < 1 or limits.per_window < 0 or limits.window_seconds <= 0:
            raise ValueError("per_batch must be >= 1, per_window >= 0 and window_seconds > 0")
        self.limits = limits
        self.trained: dict[str, deque[KeyedRating]] = {}
        self.capped_batch = 0
        self.capped_window = 0

    def plan(self) -> BatchPlan:
        return BatchPlan(self)

    def commit(self, plan: BatchPlan) -> None:
        """The planned batch is consumed (or only its skips, when it admitted nothing): its samples
        count in the window, its skips in the counters."""
        self.capped_batch += plan.capped_batch
        self.capped_window += plan.capped_window
        if not self.limits.per_window:
            return
        newest = max((r.at for r in plan.admitted), default=None)
        for r in plan.admitted:
            self.trained.setdefault(r.key_id, deque()).append(r)
        if newest is not None:
            self._expire(newest - self.limits.window_seconds)

    def forget_after(self, feedback_id: int) -> None:
        """Drop trained entries past `feedback_id` (the learner went back to an earlier cursor)."""
        for key in list(self.trained):
            kept = deque(r for r in self.trained[key] if r.feedback_id <= feedback_id)
            if kept:
                self.trained[key] = kept
            else:
                del self.trained[key]

    def _expire(self, before: float) -> None:
        for key in list(self.trained):
            q = self.trained[key]
            while q and q[0].at <= before:
                q.popleft()
            if not q:
                del self.trained[key]

    def in_window(self, key_id: str) -> int:
        return len(self.trained.get(key_id, ()))

    def stats(self) -> dict[str, float]:
        return {
            "learner/capped_ratings": float(self.capped_batch + self.capped_window),
            "learner/capped_per_batch": float(self.capped_batch),
            "learner/capped_per_window": float(self.capped_window),
            "learner/keys_in_window": float(len(self.trained)),
        }
