"""The learning view operators watch per segment: is the segment's reward rising, version by version,
and is the trained behaviour being served more?

    view = segment_learning(Lineage("cozy"), replies, behaviours=("contains:behold",), window=50)

Pure functions of what a segment was served (`Reply`: the version that served it, its text and its
ratings), newest first as the store reads them (`store.release.served_replies`, bounded to the newest K
responses of the segment, so a big store cannot make the page slow). For each version that served the
segment: its responses, its ratings' thumbs-up rate with the Wilson interval (monitor/stats.py), and
for each declared behaviour (`[monitor] behaviours`, rule specs of liveloop/rewards.py `make_reward`)
the share of its responses that show it, with its interval. Over the segment's ratings in arrival
order: the moving reward, the thumbs-up share of the last `window` ratings (fewer at the start), as a
series by rating index, each point naming the version that served the rated response.

A rating counts as positive when its reward is positive, as everywhere on the dashboard; a response
several keys rated counts once per rating.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from liveloop.monitor.stats import Rate, wilson
from liveloop.monitor.versions import BASE
from liveloop.rewards import make_reward
from liveloop.segments import Lineage
from liveloop.store.release import ReleaseQueries

DEFAULT_WINDOW = 50  # ratings in the moving reward
MAX_WINDOW = 10_000
MAX_REPLIES = 2_000  # the newest responses of a segment the view reads


@dataclass(frozen=True)
class Reply:
    """One response served to the segment: its version, reply text and ratings (feedback id, reward)."""

    version: int
    text: str
    ratings: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class BehaviourRate:
    behaviour: str  # the rule spec, e.g. "contains:behold"
    served: Rate  # responses that show it among the version's responses, with the interval


@dataclass(frozen=True)
class VersionLearning:
    version: int
    responses: int
    reward: Rate  # thumbs up among its ratings, with the interval
    behaviours: tuple[BehaviourRate, ...]


@dataclass(frozen=True)
class MovingPoint:
    index: int  # the rating's place in arrival order, from 1
    version: int  # the version that served the rated response
    reward: float  # thumbs-up share of the last `window` ratings up to this one


@dataclass(frozen=True)
class SegmentLearning:
    segment: str  # the adapter segment, or "base" for responses recorded without one
    window: int
    responses: int  # responses read (at most the bound)
    ratings: int
    versions: tuple[VersionLearning, ...]  # oldest version first
    moving: tuple[MovingPoint, ...]


def moving_reward(ratings: Sequence[tuple[int, int]], window: int) -> list[tuple[int, float]]:
    """(rating index from 1, thumbs-up share of the last `window` ratings up to it) for each of
    `ratings` (version, reward) in arrival order."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    last: deque[int] = deque(maxlen=window)
    out = []
    for i, (_, reward) in enumerate(ratings, start=1):
        last.append(1 if reward > 0 else 0)
        out.append((i, sum(last) / len(last)))
    return out


def segment_learning(
    lineage: Lineage,
    replies: Sequence[Reply],
    behaviours: Sequence[str] = (),
    window: int = DEFAULT_WINDOW,
    confidence: float = 0.95,
) -> SegmentLearning:
    """The learning view of one segment over `replies` (any order; module docstring)."""
    rules: list[tuple[str, Callable[[str], float]]] = [(spec, make_reward(spec)) for spec in behaviours]
    served: dict[int, list[int]] = {}  # version -> [responses, per behaviour: responses that show it]
    rated: dict[int, list[int]] = {}  # version -> [ratings, positive]
    arrivals: list[tuple[int, int, int]] = []  # (feedback id, version, reward)
    for reply in replies:
        counts = served.setdefault(reply.version, [0] * (1 + len(rules)))
        counts[0] += 1
        for j, (_, rule) in enumerate(rules, start=1):
            counts[j] += int(rule(reply.text) > 0)
        thumbs = rated.setdefault(reply.version, [0, 0])
        for feedback_id, reward in reply.ratings:
            thumbs[0] += 1
            thumbs[1] += int(reward > 0)
            arrivals.append((feedback_id, reply.version, reward))
    arrivals.sort()
    versions = tuple(
        VersionLearning(
            version=v,
            responses=served[v][0],
            reward=wilson(rated[v][1], rated[v][0], confidence),
            behaviours=tuple(BehaviourRate(spec, wilson(served[v][j], served[v][0], confidence)) for j, (spec, _) in enumerate(rules, start=1)),
        )
        for v in sorted(served)
    )
    in_order = [(v, r) for _, v, r in arrivals]
    moving = tuple(MovingPoint(i, in_order[i - 1][0], value) for i, value in moving_reward(in_order, window))
    return SegmentLearning(BASE if lineage.is_base else lineage.segment, window, len(replies), len(arrivals), versions, moving)


def read_segment(
    release: ReleaseQueries,
    decode: Callable[[list[list[int]]], list[str]],
    lineage: Lineage,
    behaviours: Sequence[str] = (),
    window: int = DEFAULT_WINDOW,
    confidence: float = 0.95,
    limit: int = MAX_REPLIES,
) -> SegmentLearning:
    """`segment_learning` over the newest `limit` responses the store holds for `lineage` (the base
    weights': those recorded without a segment), their ratings without quarantined keys', their replies decoded by `decode`
    (the serving tokenizer's `batch_decode`) only when a behaviour is declared."""
    served = release.served_replies(lineage.segment, limit)
    texts = decode([list(r.response_ids) for r in served]) if behaviours and served else [""] * len(served)
    replies = [Reply(r.policy_version, text, r.ratings) for r, text in zip(served, texts)]
    return segment_learning(lineage, replies, behaviours, window, confidence)
