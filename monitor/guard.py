"""The automatic guard's decision, a pure function of per-version traffic: roll back the serving
version when its users' votes are significantly below its parent's (one-sided two-proportion test on
one vote per key, as the release gate counts: release/decision.py) once it has enough ratings from
enough distinct keys. One key, however many replies it rates down, is one vote: it cannot roll a
version back alone."""

from __future__ import annotations

from dataclasses import dataclass

from liveloop.monitor.stats import compare_rates


@dataclass(frozen=True)
class Tally:
    """A version's rated traffic as the guard reads it: `ratings` counted, `positive` of them, from
    `keys` distinct keys whose positive shares sum to `votes`."""

    ratings: int
    positive: int
    keys: int
    votes: float


@dataclass(frozen=True)
class GuardVerdict:
    version: int
    parent: int
    rate: float  # the version's vote share (votes / keys)
    parent_rate: float
    p_worse: float
    keys: int = 0
    parent_keys: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "version": self.version, "parent": self.parent, "rate": self.rate, "parent_rate": self.parent_rate,
            "p_worse": self.p_worse, "keys": self.keys, "parent_keys": self.parent_keys,
        }


def judge(
    version: int, parent: int | None, tally: Tally, parent_tally: Tally, min_ratings: int, min_keys: int, p_value: float
) -> GuardVerdict | None:
    """A verdict to roll `version` back to `parent`, or None: both need `min_ratings` ratings from
    `min_keys` distinct keys, and the version's votes a one-sided p_worse below `p_value`."""
    a, b = tally, parent_tally
    if parent is None or a.ratings < min_ratings or b.ratings < min_ratings or a.keys < min_keys or b.keys < min_keys:
        return None
    c = compare_rates(a.votes, a.keys, b.votes, b.keys)
    if c is None or c.difference >= 0 or c.p_worse > p_value:
        return None
    return GuardVerdict(version, parent, a.votes / a.keys, b.votes / b.keys, c.p_worse, a.keys, b.keys)
