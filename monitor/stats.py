"""Rates of binary rewards with their uncertainty: the Wilson interval and the two-proportion z-test.

Pure functions of counts (no store, no torch), so every figure the console shows can be checked by
hand. Rewards are thumbs: a rating counts as a success when its reward is positive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_NORMAL = NormalDist()


def z_for(confidence: float) -> float:
    """The two-sided normal quantile: 1.959... for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return _NORMAL.inv_cdf(0.5 + confidence / 2)


@dataclass(frozen=True)
class Rate:
    successes: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float | None:
        return self.successes / self.n if self.n else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "positive": self.successes, "rate": self.value, "low": self.low, "high": self.high}


def wilson(successes: int, n: int, confidence: float = 0.95) -> Rate:
    """The Wilson score interval for a binomial rate (well-behaved at 0, 1 and small n); (0, 1) when
    there is no data."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return Rate(0, 0, 0.0, 1.0)
    z = z_for(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Rate(successes, n, low, high)


@dataclass(frozen=True)
class Comparison:
    """Is rate A (a new version) different from rate B (its parent)?"""

    difference: float  # rate_a - rate_b
    z: float
    p_two_sided: float
    p_worse: float  # one-sided p-value for "A is below B": small means A is significantly worse


def compare_rates(successes_a: int, n_a: int, successes_b: int, n_b: int) -> Comparison | None:
    """The pooled two-proportion z-test; None when either side has no ratings. A pooled rate of 0 or 1
    (no variance) gives z = 0: identical all-or-nothing rates are no evidence of a difference."""
    if n_a == 0 or n_b == 0:
        return None
    pa, pb = successes_a / n_a, successes_b / n_b
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = (pa - pb) / se if se > 0 else 0.0
    return Comparison(pa - pb, z, 2 * (1 - _NORMAL.cdf(abs(z))), _NORMAL.cdf(z))
