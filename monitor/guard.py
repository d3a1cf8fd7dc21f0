"""The automatic guard's decision, a pure function of per-version traffic: roll back the serving
version when its reward rate is significantly below its parent's (one-sided two-proportion test)
once it has enough ratings."""

from __future__ import annotations

from dataclasses import dataclass

from liveloop.monitor.stats import compare_rates


@dataclass(frozen=True)
class GuardVerdict:
    version: int
    parent: int
    rate: float
    parent_rate: float
    p_worse: float

    def as_dict(self) -> dict[str, float | int]:
        return {"version": self.version, "parent": self.parent, "rate": self.rate, "parent_rate": self.parent_rate, "p_worse": self.p_worse}


def judge(
    version: int, parent: int | None, ratings: tuple[int, int], parent_ratings: tuple[int, int], min_ratings: int, p_value: float
) -> GuardVerdict | None:
    """A verdict to roll `version` back to `parent`, or None. `ratings` are (positive, n)."""
    (pos, n), (ppos, pn) = ratings, parent_ratings
    if parent is None or n < min_ratings or pn < min_ratings:
        return None
    c = compare_rates(pos, n, ppos, pn)
    if c is None or c.difference >= 0 or c.p_worse > p_value:
        return None
    return GuardVerdict(version, parent, pos / n, ppos / pn, c.p_worse)
