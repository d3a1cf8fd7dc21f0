"""The disagreement score: per API key, how far its ratings are from the consensus of the OTHER keys on
the same thing, beyond what chance gives. Pure functions of the ratings (`Store.key_ratings`).

Definitions:
- Same thing ("similar"): the same reply (exact response token ids) to the same prompt (exact prompt
  token ids), whatever the policy version; `KeyRating.group`. Only ratings whose group was also rated by
  another key count; unique replies carry no consensus and are left out (`n` counts what is left).
- Consensus of a group for key k: the mean over the OTHER keys of each key's mean reward in the group
  (one vote per key, so a key that rates one reply many times does not outweigh the others), leaving
  out keys in `exclude_from_consensus` (already quarantined). Its label c is 1 above 0.5, 0 below;
  a tie (exactly 0.5) is no consensus and that rating is left out.
- A disagreement: the key's reward differs from c.
- Chance: a key that rates without looking, up with its own rate q (its mean reward over its n counted
  ratings), disagrees with c = 0 with probability q and with c = 1 with probability 1 - q. So
      expected = sum_i (q if c_i = 0 else 1 - q),  variance = n q (1 - q),
      z = (disagreements - expected) / sqrt(variance)          (0 when q is 0 or 1).
  A key with the others' taste has z well below 0; a key whose taste is unrelated to theirs (or that is
  simply harsher or kinder: q enters the chance model) has |z| small; a key that inverts their taste
  has a large positive z. Only a positive z is suspicious (`suspects`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol


class Rated(Protocol):
    key_id: str
    group: str
    reward: int


@dataclass(frozen=True)
class Disagreement:
    key_id: str
    n: int  # ratings with a consensus of other keys
    disagreements: int
    expected: float  # disagreements expected by chance, given the key's own rate
    z: float
    rate: float  # the key's mean reward over those n ratings

    def as_dict(self) -> dict[str, float | int | str]:
        return {"key_id": self.key_id, "n": self.n, "disagreements": self.disagreements, "expected": self.expected, "z": self.z, "rate": self.rate}


def consensus_labels(ratings: Iterable[Rated], exclude_from_consensus: Collection[str] = ()) -> list[tuple[Rated, int]]:
    """Each rating that has a consensus of other keys, with that consensus label (0 or 1)."""
    ratings = list(ratings)
    sums: dict[str, dict[str, list[float]]] = defaultdict(dict)  # group -> key -> [sum, count]
    for r in ratings:
        acc = sums[r.group].setdefault(r.key_id, [0.0, 0.0])
        acc[0] += float(r.reward)
        acc[1] += 1.0
    labels: dict[tuple[str, str], int | None] = {}
    out = []
    for r in ratings:
        cell = (r.group, r.key_id)
        if cell not in labels:
            votes = [s / n for k, (s, n) in sums[r.group].items() if k != r.key_id and k not in exclude_from_consensus]
            p = sum(votes) / len(votes) if votes else 0.5
            labels[cell] = 1 if p > 0.5 else 0 if p < 0.5 else None
        if labels[cell] is not None:
            out.append((r, labels[cell]))
    return out


def disagreement_scores(ratings: Iterable[Rated], exclude_from_consensus: Collection[str] = ()) -> list[Disagreement]:
    """One score per key that has at least one rating with a consensus, by key id."""
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> [(reward, label)]
    for r, label in consensus_labels(ratings, exclude_from_consensus):
        per_key[r.key_id].append((int(r.reward), label))
    return [score(key, per_key[key]) for key in sorted(per_key)]


def score(key_id: str, rated: list[tuple[int, int]]) -> Disagreement:
    """The z-statistic of one key from its (reward, consensus label) pairs."""
    n = len(rated)
    if n == 0:
        return Disagreement(key_id, 0, 0, 0.0, 0.0, 0.0)
    q = sum(r for r, _ in rated) / n
    disagreements = sum(1 for r, c in rated if r != c)
    expected = sum(q if c == 0 else 1.0 - q for _, c in rated)
    variance = n * q * (1.0 - q)
    z = (disagreements - expected) / math.sqrt(variance) if variance > 0 else 0.0
    return Disagreement(key_id, n, disagreements, expected, z, q)


def suspects(scores: Iterable[Disagreement], z_threshold: float, min_ratings: int) -> list[Disagreement]:
    """Keys to quarantine: at least `min_ratings` counted ratings and z above `z_threshold` (> 0)."""
    if z_threshold <= 0:
        return []
    return [s for s in scores if s.n >= min_ratings and s.z > z_threshold]
