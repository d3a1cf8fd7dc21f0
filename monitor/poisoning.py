"""The disagreement score: per API key, how far its ratings are from the consensus of the OTHER keys on
the same thing, beyond what chance gives; and the quarantine rule on it, which up to
`min_corroborating_keys - 1` colluding keys cannot turn against an honest key. Pure functions of the
ratings (`store.keys.key_ratings`).

- Same thing: replies to the same prompt whose token ids are alike (`Similarity`), grouped by
  `ReplyGroups` / `reply_groups`; only groups another key also rated count.
- Consensus: the other keys' vote in the group, one vote per key (`_Votes.label`).
- Score: the key's disagreements with the consensus against those of a key that rates without looking
  at its own rate, as a z-statistic (`score`); only a positive z is suspicious (`suspects`).
- Corroboration: a suspect is quarantined only when it stays over the threshold with its
  `min_corroborating_keys - 1` top accusers left out of the consensus (`find_suspects`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Rated(Protocol):
    key_id: str
    group: str  # exact identity of (prompt, reply)
    reward: int


@dataclass(frozen=True)
class Similarity:
    """When two replies to the same prompt are the same thing for the consensus."""

    jaccard: float = 0.8  # shingle-set Jaccard at or above which two replies are alike; >= 1: exact copies only
    shingle: int = 1  # tokens per shingle (1: token sets; 2: bigrams, order-sensitive)
    max_candidates: int = 4  # groups compared exactly per reply (the ones sharing most indexed shingles)
    max_postings: int = 64  # groups one shingle indexes per prompt (a commoner shingle stops indexing)

    def __post_init__(self) -> None:
        if not 0 < self.jaccard or self.shingle < 1 or self.max_candidates < 1 or self.max_postings < 1:
            raise ValueError("jaccard must be > 0, shingle, max_candidates and max_postings >= 1")


EXACT = Similarity(jaccard=1.0)


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


# -- which replies are the same thing ----------------------------------------------------------------
def shingles(tokens: Sequence[int], k: int = 1) -> frozenset[tuple[int, ...]]:
    """The set of k-token shingles of a reply (a reply shorter than k is one shingle, itself)."""
    tokens = tuple(tokens)
    if len(tokens) <= k:
        return frozenset([tokens])
    return frozenset(tokens[i:i + k] for i in range(len(tokens) - k + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """|a & b| / |a | b| (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


class ReplyGroups:
    """Which replies are the same thing for the consensus: replies to the same prompt (exact prompt token
    ids) whose response token ids are alike (`Similarity`: token-shingle Jaccard at least `jaccard`),
    whatever the policy version. Replies are clustered per prompt in arrival order: exact copies share
    their first copy's group; another reply joins the most similar existing group whose representative
    (its first reply) it is alike, else starts a group. Candidates come from an inverted index of the
    representatives' shingles (a shingle indexes at most `max_postings` groups, at most `max_candidates`
    are compared exactly), so the cost per reply is bounded, O(n) per prompt. A rating without token ids
    (`tokens` empty and no `prompt`) keeps its `group` (exact identity).

    It remembers: each exact reply keeps the similarity group it got when first seen, so a caller that scores a sliding window again and again (the monitor, every few polls) pays
    for the new replies only. Holds at most `max_replies` exact replies; past that it starts over (the
    next call groups its whole window afresh, as `reply_groups` would). Not thread-safe: one caller at
    a time (the monitor holds a lock around it)."""

    def __init__(self, similarity: Similarity = Similarity(), max_replies: int = 200_000):
        self.similarity = similarity
        self.max_replies = max_replies
        self._reset()

    def _reset(self) -> None:
        self._by_exact: dict[str, str] = {}  # exact group -> similarity group
        self._reps: dict[str, list[frozenset]] = defaultdict(list)  # prompt -> representatives' shingles, by group index
        self._index: dict[str, dict[tuple[int, ...], list[int]]] = defaultdict(dict)  # prompt -> shingle -> group indexes

    def __call__(self, ratings: Sequence[Rated]) -> list[str]:
        """The consensus group of each rating, in order."""
        if len(self._by_exact) > self.max_replies:
            self._reset()
        known = self._by_exact
        return [known[r.group] if r.group in known else self._place(r) for r in ratings]

    def _place(self, r: Rated) -> str:
        similarity = self.similarity
        prompt, tokens = getattr(r, "prompt", ""), getattr(r, "tokens", ())
        if not prompt or similarity.jaccard >= 1.0:
            self._by_exact[r.group] = r.group
            return r.group
        mine = shingles(tokens, similarity.shingle)
        shared: dict[int, int] = {}  # group -> indexed shingles in common (a lower bound of the intersection)
        postings = self._index[prompt]
        reps = self._reps[prompt]
        for sh in mine:
            for g in postings.get(sh, ()):
                shared[g] = shared.get(g, 0) + 1
        best, best_j = None, 0.0
        for g, _ in sorted(shared.items(), key=lambda kv: (-kv[1], kv[0]))[: similarity.max_candidates]:
            j = jaccard(mine, reps[g])
            if j >= similarity.jaccard and (j > best_j or (j == best_j and g < best)):
                best, best_j = g, j
        if best is None:
            best = len(reps)
            reps.append(mine)
            for sh in mine:
                lst = postings.setdefault(sh, [])
                if len(lst) < similarity.max_postings:
                    lst.append(best)
        label = f"{prompt}/{best}"
        self._by_exact[r.group] = label
        return label


def reply_groups(ratings: Sequence[Rated], similarity: Similarity = Similarity()) -> list[str]:
    """The consensus group of each rating, in order (`ReplyGroups`, grouping afresh)."""
    return ReplyGroups(similarity)(ratings)


# -- consensus and the score ---------------------------------------------------------------------------
class _Votes:
    """The ratings with their groups and each key's mean reward per group (computed once)."""

    def __init__(self, ratings: Iterable[Rated], groups: ReplyGroups):
        self.ratings = list(ratings)
        self.groups = groups(self.ratings)
        sums: dict[str, dict[str, list[float]]] = defaultdict(dict)  # group -> key -> [sum, count]
        for r, g in zip(self.ratings, self.groups):
            acc = sums[g].setdefault(r.key_id, [0.0, 0.0])
            acc[0] += float(r.reward)
            acc[1] += 1.0
        self.means = {g: {k: s / n for k, (s, n) in per_key.items()} for g, per_key in sums.items()}

    def label(self, group: str, key_id: str, exclude: Collection[str]) -> int | None:
        """The consensus of `group` for `key_id`: the mean over the OTHER keys (less `exclude`, the
        quarantined) of each key's mean reward in the group: one vote per key, so a key that rates one
        reply, or many near-copies of it, many times does not outweigh the others. 1 above 0.5, 0 below;
        a tie (exactly 0.5) is no consensus (None), and that rating is left out. Only groups another key
        also rated have one: unique replies carry no consensus (a score's `n` counts what is left)."""
        votes = [m for k, m in self.means[group].items() if k != key_id and k not in exclude]
        p = sum(votes) / len(votes) if votes else 0.5
        return 1 if p > 0.5 else 0 if p < 0.5 else None

    def labelled(self, exclude: Collection[str], only_key: str | None = None) -> list[tuple[Rated, str, int]]:
        cache: dict[tuple[str, str], int | None] = {}
        out = []
        for r, g in zip(self.ratings, self.groups):
            if only_key is not None and r.key_id != only_key:
                continue
            cell = (g, r.key_id)
            if cell not in cache:
                cache[cell] = self.label(g, r.key_id, exclude)
            if cache[cell] is not None:
                out.append((r, g, cache[cell]))
        return out

    def scores(self, exclude: Collection[str]) -> list[Disagreement]:
        per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for r, _, label in self.labelled(exclude):
            per_key[r.key_id].append((int(r.reward), label))
        return [score(key, per_key[key]) for key in sorted(per_key)]

    def key_score(self, key_id: str, exclude: Collection[str]) -> Disagreement:
        return score(key_id, [(int(r.reward), c) for r, _, c in self.labelled(exclude, only_key=key_id)])

    def accusers(self, key_id: str, exclude: Collection[str]) -> Counter[str]:
        """Per other key: the groups where `key_id` disagreed with the consensus and that key voted on
        the consensus side (one count per key per group)."""
        seen: set[str] = set()
        out: Counter[str] = Counter()
        for r, g, c in self.labelled(exclude, only_key=key_id):
            if int(r.reward) == c or g in seen:
                continue
            seen.add(g)
            for k, m in self.means[g].items():
                if k != key_id and k not in exclude and (m > 0.5 if c == 1 else m < 0.5):
                    out[k] += 1
        return out


def consensus_labels(
    ratings: Iterable[Rated], exclude_from_consensus: Collection[str] = (), similarity: Similarity = Similarity()
) -> list[tuple[Rated, int]]:
    """Each rating that has a consensus of other keys, with that consensus label (0 or 1)."""
    return [(r, c) for r, _, c in _Votes(ratings, ReplyGroups(similarity)).labelled(exclude_from_consensus)]


def disagreement_scores(
    ratings: Iterable[Rated], exclude_from_consensus: Collection[str] = (), similarity: Similarity = Similarity()
) -> list[Disagreement]:
    """One score per key that has at least one rating with a consensus, by key id."""
    return _Votes(ratings, ReplyGroups(similarity)).scores(exclude_from_consensus)


def score(key_id: str, rated: list[tuple[int, int]]) -> Disagreement:
    """The z-statistic of one key from its (reward, consensus label) pairs. A disagreement: the reward
    differs from the label c; each of the key's own ratings counts (each is one trained sample).

    Chance: a key that rates without looking, up with its own rate q (its mean reward over its n
    counted ratings), disagrees with c = 0 with probability q and with c = 1 with probability 1 - q:
        expected = sum_i (q if c_i = 0 else 1 - q),  variance = n q (1 - q),
        z = (disagreements - expected) / sqrt(variance)          (0 when q is 0 or 1).
    A key with the others' taste has z well below 0; one whose taste is unrelated to theirs (or simply
    harsher or kinder: q enters the chance model) has |z| small; one that inverts it a large positive z."""
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
    """Keys over the threshold: at least `min_ratings` counted ratings and z above `z_threshold` (> 0).
    Uncorroborated: `find_suspects` is the quarantine rule."""
    if z_threshold <= 0:
        return []
    return [s for s in scores if s.n >= min_ratings and s.z > z_threshold]


def top_accusers(accusers: Counter[str], count: int) -> list[str]:
    """The `count` keys that most often sided against a key (ties: by key id)."""
    return [k for k, _ in sorted(accusers.items(), key=lambda kv: (-kv[1], kv[0]))[: max(0, count)]]


@dataclass(frozen=True)
class Suspect:
    """A key the quarantine rule takes: its score, and its score without its top accusers."""

    score: Disagreement
    corroborated: Disagreement
    left_out: tuple[str, ...]  # the accusers left out of the consensus for `corroborated`


def find_suspects(
    ratings: Iterable[Rated],
    z_threshold: float,
    min_ratings: int,
    min_corroborating_keys: int = 11,
    exclude_from_consensus: Collection[str] = (),
    similarity: Similarity = Similarity(),
    groups: ReplyGroups | None = None,
) -> tuple[list[Disagreement], list[Suspect]]:
    """Every key's score, and the keys to quarantine: over the threshold (`suspects`) and still over it
    with their `min_corroborating_keys - 1` top accusers left out of the consensus. Keys in
    `exclude_from_consensus` are scored but never vote. A caller that scores a sliding window
    repeatedly passes its own `groups` (a `ReplyGroups` of the same similarity) and pays for new
    replies only; otherwise the replies are grouped afresh.

    Why corroboration: a key's accusers are the other keys whose vote, in a group where it disagreed,
    was on the consensus side (one count per key per group). Colluders who rate an honest key's replies
    inverted are its top accusers (each sides against it in every group it was framed in): up to
    `min_corroborating_keys - 1` of them are all left out, and nothing is left against it. No rule can
    do better from ratings alone: C keys that alone rated the same replies as one key, against it, look
    exactly like one poisoner outvoted by C honest keys, so the bar is set by how many colluders to
    withstand (the shipped 11 withstands 10, bench/collusion.py `--framing`)."""
    if groups is not None and groups.similarity != similarity:
        raise ValueError("groups were built for another similarity")
    votes = _Votes(ratings, groups if groups is not None else ReplyGroups(similarity))
    exclude = set(exclude_from_consensus)
    scores = votes.scores(exclude)
    out = []
    for s in suspects(scores, z_threshold, min_ratings):
        left_out = tuple(top_accusers(votes.accusers(s.key_id, exclude), min_corroborating_keys - 1))
        again = votes.key_score(s.key_id, exclude | set(left_out)) if left_out else s
        if suspects([again], z_threshold, min_ratings):
            out.append(Suspect(s, again, left_out))
    return scores, out
