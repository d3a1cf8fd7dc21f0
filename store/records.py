"""Typed messages into and out of the store: plain dataclasses, no ORM state, safe across threads."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from liveloop.sampling import Sampling
from liveloop.store.linking import LinkKeys
from liveloop.store.status import VersionStatus

VersionSpans = tuple[tuple[int, int, int], ...]


class InvalidVersionSpans(ValueError):
    """A response's version spans are not ordered, contiguous spans covering all its tokens."""


def check_version_spans(spans: Any, n_tokens: int) -> VersionSpans | None:
    """`spans` as a tuple of (start, end, version) int triples; raises InvalidVersionSpans unless they
    are non-empty, in order and contiguous, and cover exactly [0, n_tokens). None stays None."""
    if spans is None:
        return None
    try:
        out = tuple((int(a), int(b), int(v)) for a, b, v in spans)
    except (TypeError, ValueError) as exc:
        raise InvalidVersionSpans(f"version spans must be (start, end, version) integer triples: {spans!r}") from exc
    at = 0
    for start, end, version in out:
        if start != at or end <= start or version < 0:
            raise InvalidVersionSpans(f"version spans must be contiguous, non-empty and in order from 0: {out!r}")
        at = end
    if at != n_tokens:
        raise InvalidVersionSpans(f"version spans cover [0, {at}), the response has {n_tokens} tokens: {out!r}")
    return out


@dataclass(frozen=True)
class ResponseRecord:
    """One served response, exactly as the engine produced it."""

    id: str
    api_key_id: str
    model: str
    policy_version: int
    endpoint: str  # "chat" | "completion"
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    behavior_logprobs: tuple[float, ...]
    finish_reason: str
    temperature: float
    top_p: float
    latency_ms: float
    seed: int | None = None
    ttft_ms: float | None = None
    action_mask: tuple[int, ...] | None = None
    request_meta: dict[str, Any] | None = None
    created_at: datetime | None = None
    segment: str | None = None  # the adapter segment that served it (None: adapters are off)
    # which version sampled which tokens: (start, end, version) over response token indexes [start, end),
    # in order and covering the response; None: all of it by `policy_version` (a drain swap, or no swap).
    # A `keep` swap continues a running response under new weights, so one response can have several.
    version_spans: VersionSpans | None = None
    # a chat-shaped request (chat, Anthropic messages, the Responses API), in OpenAI chat's message shape:
    messages: list[dict[str, Any]] | None = None  # the conversation asked (a Responses turn: its own input only)
    tools: list[dict[str, Any]] | None = None  # the tool definitions offered
    output: dict[str, Any] | None = None  # the reply as a message: content and tool_calls
    options: dict[str, Any] | None = None  # what a read echoes: instructions, tool_choice, response_format, ...
    grammar: str | None = None  # the constraint (xgrammar structural tag) its tokens were sampled under
    # how its tokens were drawn, as its behaviour logprobs describe them (None: raw logprobs of a draw at
    # `temperature` and `top_p`, as a row from before migration 0016 reads)
    sampling: Sampling | None = None
    previous_response_id: str | None = None  # the Responses API: the turn it continues
    group_id: str | None = None  # n > 1: the request's first choice's id
    choice_index: int = 0
    # how the store finds the turn this one continues (store/linking.py; None: it is never linked by
    # its tokens) and the episode the client named (`metadata.episode_id`)
    link: LinkKeys | None = None
    episode_tag: str | None = None

    def __post_init__(self) -> None:
        assert len(self.response_ids) == len(self.behavior_logprobs), "one logprob per response token"
        assert self.action_mask is None or len(self.action_mask) == len(self.response_ids)
        # refused here, before it reaches the writer's queue: a record that exists is a valid one
        object.__setattr__(self, "version_spans", check_version_spans(self.version_spans, len(self.response_ids)))


@dataclass(frozen=True)
class FeedbackRecord:
    response_id: str
    api_key_id: str
    reward: int  # 0 or 1
    comment: str | None = None


@dataclass(frozen=True)
class StoredFeedback:
    id: int
    response_id: str
    api_key_id: str
    reward: int
    comment: str | None
    created_at: datetime
    revisions: int = 0  # how often the key changed its mind (the row keeps its id)


@dataclass(frozen=True)
class StoredResponse:
    id: str
    api_key_id: str
    model: str
    policy_version: int
    endpoint: str
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    behavior_logprobs: np.ndarray
    action_mask: np.ndarray  # all ones for a plain response
    finish_reason: str
    temperature: float
    top_p: float
    seed: int | None
    latency_ms: float
    ttft_ms: float | None
    request_meta: dict[str, Any] | None
    created_at: datetime
    segment: str | None = None
    version_spans: VersionSpans | None = None  # as in ResponseRecord: None = all of it by policy_version
    grammar: str | None = None  # the constraint its tokens were sampled under (None: free sampling)
    sampling: Sampling | None = None  # how its tokens were drawn (`stored_sampling`; None: not read)
    group_id: str | None = None
    choice_index: int = 0
    # the episode it is a turn of (store/episodes.py): the turn it continues (None: a first turn), the
    # first turn, its place, and how many of its prompt tokens are the parent's tokens (None: not exactly)
    parent_id: str | None = None
    root_id: str | None = None
    turn: int = 0
    prefix_tokens: int | None = None


@dataclass(frozen=True)
class StoredConversation:
    """What a chat-shaped response was asked and answered, as the API's reads return it (OpenAI chat
    message shape throughout)."""

    id: str
    api_key_id: str
    model: str
    endpoint: str
    policy_version: int
    created_at: datetime
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    request_meta: dict[str, Any] | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    output: dict[str, Any] | None
    options: dict[str, Any] | None
    previous_response_id: str | None
    version_spans: VersionSpans | None = None


@dataclass(frozen=True)
class VersionRecord:
    version: int
    parent: int | None
    created_at: datetime
    checkpoint_path: str | None
    checkpoint_sha256: str | None
    learner_step: int
    samples_used: int
    metrics: dict[str, Any] = field(default_factory=dict)
    status: VersionStatus = VersionStatus.SERVING
    note: str | None = None
    pinned: bool = False  # an operator keeps its checkpoint whatever retention says
    pruned_at: datetime | None = None  # when retention deleted its checkpoint (then it cannot serve again)
    segment: str | None = None  # None: base weights; a name: that segment's LoRA adapter (checkpoint = adapter dir)
    weights_nonce: str | None = None  # the transport's nonce for the attempt that carried these weights
    weights_digest: str | None = None  # the sender's digest of the tensors it carried (receivers verify it)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", VersionStatus(self.status))  # a plain string names a member


@dataclass(frozen=True)
class Activation:
    """A version made SERVING by activation: the lineage's version it replaced (None: none served it)
    and the published versions it superseded."""

    version: int
    previous: int | None
    superseded: list[int]


@dataclass(frozen=True)
class RatingEvent:
    """One rating as the drift monitor sees it: when, what, for which version and segment tags."""

    feedback_id: int
    created_at: datetime
    reward: int
    policy_version: int
    request_meta: dict[str, Any] | None


@dataclass(frozen=True)
class ServedReply:
    """One response a segment was served, as the learning view reads it: the version that served it,
    its reply tokens and its ratings (feedback id, reward) in arrival order."""

    response_id: str
    policy_version: int
    response_ids: tuple[int, ...]
    ratings: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class VersionTraffic:
    """A version's served and rated traffic, counted by episode. `keys` is the number of distinct keys
    that rated it and `votes` the sum over those keys of each key's positive share (a key that rated 3
    of its 4 episodes up adds 0.75): one vote per key, what the release gate and the guard compare."""

    version: int
    responses: int
    ratings: int
    positive: int
    keys: int = 0
    votes: float = 0.0


@dataclass(frozen=True)
class OperatorEventRecord:
    id: int
    kind: str
    version: int | None
    detail: dict[str, Any]
    api_key_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class EvaluationRecord:
    """A stored evaluation of `version` against `live_version` (None: nothing served to compare with):
    `checks` as written, one {name, value, live, base, bound, passed} object per check (a value that
    was not a finite number reads back as None); `seconds` its wall clock, `engine_seconds` the part
    spent generating on the engines."""

    version: int
    live_version: int | None
    passed: bool
    checks: list[dict[str, Any]]
    seconds: float
    engine_seconds: float
    created_at: datetime


@dataclass(frozen=True)
class EpisodeTurn:
    """One turn of an episode as the learner reads it: its sampled tokens and how they sit in the
    next turn's prompt (`prefix_tokens` of the NEXT turn says how many of them it carries)."""

    id: str
    api_key_id: str
    parent_id: str | None
    turn: int
    policy_version: int
    prompt_tokens: int
    prefix_tokens: int | None  # how many of its prompt's tokens are the parent's (None: not exactly, or a first turn)
    response_ids: np.ndarray
    behavior_logprobs: np.ndarray
    version_spans: VersionSpans | None
    grammar: str | None
    finish_reason: str
    created_at: datetime
    sampling: Sampling | None = None  # as StoredResponse's


@dataclass(frozen=True)
class Episode:
    """The turns from an episode's first (or the oldest still stored) to the one asked for, and that
    last turn's prompt tokens, which hold every earlier turn's tokens where they were linked exactly."""

    turns: tuple[EpisodeTurn, ...]
    prompt_ids: np.ndarray
    complete: bool  # False: a turn before the first read is gone (deleted, or taken by retention)


@dataclass(frozen=True)
class TurnView:
    id: str
    turn: int
    policy_version: int
    prompt_tokens: int
    completion_tokens: int
    observation_tokens: int | None  # the tokens between the previous turn's and this one's (None: not linked exactly)
    linked_by: str | None
    finish_reason: str
    tool_calls: tuple[str, ...]  # the names of the tools it called
    reward: int | None  # its owner's rating (None: not rated)
    other_branches: int  # continuations of this turn other than the one this episode takes
    created_at: datetime


@dataclass(frozen=True)
class EpisodeView:
    """An episode as an operator reads it (`GET /admin/episodes/{id}`)."""

    api_key_id: str
    turns: tuple[TurnView, ...]
    complete: bool


def stored_sampling(data: dict[str, Any] | None, temperature: float, top_p: float) -> Sampling:
    """A `responses` row's sampling: its record, or for a row from before migration 0016 (NULL) the raw
    logprobs of a draw at its temperature and top_p (what every engine logged then)."""
    return Sampling.logged_raw(temperature, top_p) if data is None else Sampling.from_json(data)
