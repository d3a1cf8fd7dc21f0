"""Intervals over seeds: what every multi-seed result here reports its numbers with.

- `mean_ci(values)`: the mean with its two-sided 95% Student-t interval (reward, exposure, a lever's
  paired effect).
- `median_ci(values)`: the median with a distribution-free interval from order statistics (ratings to an
  effect, where a run that never got there counts as "more than the cap": `None` sorts last, and an
  interval end that lands on such a run is open, reported as None). With 5 seeds it is [min, max],
  which covers the median with probability 1 - 2/32 = 0.94.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its two-sided 95% t-interval (None with fewer than two values)."""

    mean: float
    low: float | None
    high: float | None
    n: int

    def __str__(self) -> str:
        if self.low is None or self.high is None:
            return f"{self.mean:.3f}"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


# two-sided 95% quantiles of Student's t by degrees of freedom (scipy is not a dependency); beyond 30
# the normal's 1.96
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
       29: 2.045, 30: 2.042}


def t95(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return T95.get(df, 1.96)


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval: mean +- t(n-1) * sd / sqrt(n), sd the sample standard deviation."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, None, None, len(values))
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))


@dataclass(frozen=True)
class MedianInterval:
    """A median over seeds (None: more than half never reached it) with an order-statistic interval
    of at least `coverage` (an end of None: a run that never reached it, i.e. open)."""

    median: float | None
    low: float | None
    high: float | None
    coverage: float
    n: int

    def __str__(self) -> str:
        def show(x: float | None) -> str:
            return ">cap" if x is None else f"{x:g}"

        return f"{show(self.median)} [{show(self.low)}, {show(self.high)}]"


def median_ci(values: Sequence[float | None], confidence: float = 0.95) -> MedianInterval:
    """The median and the narrowest symmetric order-statistic interval [x(k), x(n+1-k)] whose binomial
    coverage is at least `confidence`, or the widest ([min, max]) when none is (n < 6 at 95%). None
    values are runs past the cap: larger than every number."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    ordered = sorted(values, key=lambda v: (v is None, v if v is not None else 0.0))

    def at(i: int) -> float | None:  # 0-based order statistic
        return ordered[i]

    if n % 2:
        median = at(n // 2)
    else:
        lo, hi = at(n // 2 - 1), at(n // 2)
        median = None if lo is None or hi is None else (lo + hi) / 2
    # coverage of [x(k), x(n+1-k)] (1-based) = P(k <= B <= n-k), B ~ Binomial(n, 1/2)
    best_k, best_cov = 1, _coverage(n, 1)
    for k in range(2, n // 2 + 1):
        cov = _coverage(n, k)
        if cov < confidence:
            break
        best_k, best_cov = k, cov
    return MedianInterval(median, at(best_k - 1), at(n - best_k), best_cov, n)


def _coverage(n: int, k: int) -> float:
    return sum(math.comb(n, j) for j in range(k, n - k + 1)) / 2**n
