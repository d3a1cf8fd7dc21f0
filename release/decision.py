"""What the gate does with a candidate now: promote it, hold it, or wait. Pure: counts in, a
`Decision` out, so every verdict can be checked by hand.

- `canary`: a failed evaluation holds at once (no need to expose more users). Otherwise the candidate
  waits for `min_ratings` ratings of its own, from at least `min_keys` distinct (unquarantined) keys,
  and the live version needs `min_keys` keys too; then it is held when its vote share is significantly
  below the live version's, else it is promoted once its evaluation has passed (still running: wait).
  One vote per key: each key that rated a version adds its own positive share (its mean, in [0, 1]), so
  a key that rates 30 replies counts as much as one that rates one; the votes of each side are compared
  with the pooled two-proportion z-test of monitor/stats.py on (votes, keys), one-sided: p_worse <
  `p_value`. With one rating per key this is exactly the test on ratings; a key's mean has no more
  variance than one Bernoulli rating, so many ratings per key make it conservative, never eager. Not being
  significantly worse is the bar, not being better: a candidate carries the training of every rating
  since the live version, and a gate that asked for proof of improvement would hold most of them.
- `gated`: the evaluation alone decides (pass: promote, fail: hold, running: wait); no user rated it.
- `immediate`: always promote (the gate only evaluates, after the fact).

With `[release.evaluation] enabled = false` (canary only: gated refuses it at load) the evaluation
counts as passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from liveloop.monitor.stats import compare_rates
from liveloop.release.config import Mode, ReleaseConfig

Action = Literal["promote", "hold", "wait"]


class Counts(Protocol):
    """A version's rated traffic (the store's `VersionTraffic` is one): its ratings, and its votes, one
    per rating key (`votes`: the sum of the keys' positive shares)."""

    ratings: int
    positive: int
    keys: int
    votes: float


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    p_worse: float | None = None  # the one-sided p-value of "the candidate is rated worse" (canary, once judged)


def decide(candidate: Counts, live: Counts, evaluation_passed: bool | None, mode: Mode, config: ReleaseConfig) -> Decision:
    """The gate's verdict on `candidate` against the `live` version (see the module docstring);
    `evaluation_passed` None: its evaluation is still running."""
    if mode == "immediate":
        return Decision("promote", "immediate mode")
    if not config.evaluation.enabled:
        evaluation_passed = True
    if evaluation_passed is False:
        return Decision("hold", "evaluation failed")
    if mode == "gated":
        return Decision("wait", "evaluation running") if evaluation_passed is None else Decision("promote", "evaluation passed")
    if candidate.ratings < config.min_ratings:
        return Decision("wait", f"{candidate.ratings} of {config.min_ratings} ratings")
    if candidate.keys < config.min_keys:
        return Decision("wait", f"ratings from {candidate.keys} of {config.min_keys} keys")
    if live.keys == 0:
        return Decision("wait", "the live version has no ratings to compare with")
    if live.keys < config.min_keys:
        return Decision("wait", f"the live version has ratings from {live.keys} of {config.min_keys} keys")
    comparison = compare_rates(candidate.votes, candidate.keys, live.votes, live.keys)
    assert comparison is not None  # both sides have keys
    rates = (
        f"votes {candidate.votes:.1f}/{candidate.keys} keys vs live {live.votes:.1f}/{live.keys} "
        f"({candidate.positive}/{candidate.ratings} vs {live.positive}/{live.ratings} ratings), p_worse {comparison.p_worse:.3g}"
    )
    if comparison.p_worse < config.p_value:
        return Decision("hold", f"rated worse than live ({rates})", comparison.p_worse)
    if evaluation_passed is None:
        return Decision("wait", f"evaluation running (ratings not worse: {rates})", comparison.p_worse)
    return Decision("promote", f"evaluation passed, ratings not worse ({rates})", comparison.p_worse)
