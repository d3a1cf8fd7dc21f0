"""The admin API's bodies (server/edge/admin/): its requests (swaps, rollbacks, pauses, forgetting and
quarantining keys) and the pydantic models of its responses, which the routes declare (/openapi.json
shows them); server/edge/admin/views.py builds them from the domain's typed results.

Bodies that were plain dicts (`_View`) write NaN and infinities as null, as FastAPI wrote those dicts;
`_Body` ones as Python's JSON does. `Number` keeps an int an int (a `float` field writes 1 as 1.0). A
field defaulting to `MISSING` is absent from the JSON unless set (a null segment, `settled` outside a
settled read, the keys only a gated release has)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import MISSING, BaseModel, ConfigDict, Field, model_serializer, model_validator

from liveloop.server.control.operations import KeyRow
from liveloop.server.edge.protocol import INT32_MAX, Text, _Strict
from liveloop.store.replicas import ReplicaRow


class SwapRequest(_Strict):
    path: Annotated[Text, Field(min_length=1, max_length=4096)]
    note: Annotated[Text, Field(max_length=1000)] | None = None


Segment = Annotated[Text, Field(min_length=1, max_length=256)]  # an adapter segment's name (`[segments] names`)


class RollbackRequest(_Strict):
    version: Annotated[int, Field(ge=0, le=INT32_MAX)]
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # move this segment's adapter lineage only (to a base version: no adapter)
    # the version the operator saw serving (that lineage): 409 serving_changed if another serves now
    expect_serving: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class PauseRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    segment: Segment | None = None  # pause or resume this segment's lane only


class ForgetRequest(_Strict):
    weights: bool = False  # also roll the key's training out of the weights (server/control/forgetting.py)
    dry_run: bool = False  # with weights: only report what it would do

    @model_validator(mode="after")
    def _dry_run_needs_weights(self) -> "ForgetRequest":
        if self.dry_run and not self.weights:
            raise ValueError("dry_run: only a forget with weights: true has a plan to report")
        return self


class QuarantineRequest(_Strict):
    reason: Annotated[Text, Field(max_length=1000)] | None = None


# -- response bodies -------------------------------------------------------------------------------------
class _Body(BaseModel):
    """A response body: every field goes out, floats as Python's JSON writes them (NaN included)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")


class _View(_Body):
    """A response body that replaced a plain dict: NaN and infinities go out as null, as they did."""

    model_config = ConfigDict(ser_json_inf_nan="null", extra="forbid")  # forbid: a new key of an open dict fails loudly


Number = int | float  # as the domain wrote it: 1 stays 1, 1.5 stays 1.5


class PinResult(_Body):
    """POST /admin/versions/{v}/pin and /unpin."""

    object: Literal["policy_version"] = "policy_version"
    version: int
    pinned: bool
    changed: bool


class Disagreement(_Body):
    n: int
    disagreements: int
    expected: float
    z: float


class KeyView(_Body):
    """One API key as operators see it (GET /admin/keys)."""

    key_id: str
    quarantined: bool
    reason: str | None
    ratings: int
    forgotten_at: float | None  # unix seconds
    disagreement: Disagreement | None  # None: no rating with a consensus of other keys

    @classmethod
    def of(cls, row: KeyRow) -> "KeyView":
        k, d = row.state, row.disagreement
        return cls(
            key_id=k.key_id, quarantined=k.quarantined, reason=k.reason, ratings=k.ratings,
            forgotten_at=k.forgotten_at.timestamp() if k.forgotten_at else None,
            disagreement=None if d is None else Disagreement(n=d.n, disagreements=d.disagreements, expected=d.expected, z=d.z),
        )


class KeyList(_Body):
    object: Literal["list"] = "list"
    data: list[KeyView]


class Quarantined(_Body):
    """POST and DELETE /admin/keys/{key_id}/quarantine."""

    object: Literal["api_key"] = "api_key"
    key_id: str
    quarantined: bool
    changed: bool


class Forgotten(_Body):
    """POST /admin/keys/{key_id}/forget without `weights`: what was deleted."""

    object: Literal["api_key.forgotten"] = "api_key.forgotten"
    key_id: str
    responses_deleted: int
    ratings_deleted: int


class ForgetPlanView(_View):
    """POST /admin/keys/{key_id}/forget with `weights`: the plan (each lineage's, as forgetting.py has it),
    what was deleted unless a dry run, and what was done."""

    object: Literal["api_key.forget_plan", "api_key.forgotten"]
    key_id: str
    dry_run: bool
    responses: int
    ratings: int
    replay: int
    estimate_seconds: Number | None
    lineages: list[dict[str, Any]]
    responses_deleted: int | MISSING = MISSING
    ratings_deleted: int | MISSING = MISSING
    done: list[dict[str, Any]] | MISSING = MISSING


class ReplicaView(_Body):
    """One replica of the fleet (GET /admin/replicas, the dashboard's fleet panel)."""

    id: str
    kind: str
    host: str
    pid: int
    state: str
    serving_version: int | None
    adapter_versions: dict[str, int | None]
    in_flight: int
    healthy: bool
    started_at: float  # unix seconds
    heartbeat_at: float
    heartbeat_age_seconds: float

    @classmethod
    def of(cls, row: ReplicaRow) -> "ReplicaView":
        return cls(
            id=row.replica_id, kind=row.kind, host=row.host, pid=row.pid, state=row.state, serving_version=row.serving_version,
            adapter_versions=row.adapter_versions, in_flight=row.in_flight, healthy=row.healthy,
            started_at=row.started_at.timestamp(), heartbeat_at=row.heartbeat_at.timestamp(), heartbeat_age_seconds=row.age_seconds,
        )


class ReplicaList(_Body):
    object: Literal["list"] = "list"
    replica: str  # the one that answered
    data: list[ReplicaView]


class EventView(_Body):
    """One operator event (GET /admin/events)."""

    id: int
    kind: str
    version: int | None
    detail: dict[str, Any]
    api_key_id: str | None
    at: float  # unix seconds


class EventList(_Body):
    object: Literal["list"] = "list"
    data: list[EventView]


# -- versions (server/edge/admin/versions.py) -------------------------------------------------------------
class RewardView(_View):
    """A rate with its Wilson interval (monitor/stats.py `Rate`)."""

    n: int
    positive: int
    rate: float | None  # None: no ratings
    low: Number
    high: Number


class ComparisonView(_View):
    """A version's rate against its parent's (monitor/stats.py `Comparison`)."""

    difference: Number
    z: Number
    p_two_sided: Number
    p_worse: Number


class VersionView(_View):
    """One policy version (GET /admin/versions)."""

    version: int
    parent: int | None
    segment: str | None  # its adapter lineage; None: the base weights'
    created: Number  # unix seconds
    status: str
    serving: bool
    learner_step: int
    samples_used: int
    note: str | None
    metrics: dict[str, Any]
    responses: int
    rating_rate: Number | None
    reward: RewardView
    vs_parent: ComparisonView | None
    checkpoint: str  # durable | writing | pruned (monitor/versions.py `checkpoint_state`)
    rollback_target: bool


class VersionList(_View):
    """GET /admin/versions: a page of versions, oldest first; `segment` and `adapter` with `?segment=`."""

    object: Literal["list"] = "list"
    serving: int
    segment: str | MISSING = MISSING
    adapter: int | None | MISSING = MISSING  # the adapter version serving that segment (None: the base weights)
    data: list[VersionView]
    has_more: bool
    settled: bool | MISSING = MISSING


class LatestVersion(_View):
    version: int
    status: str
    parent: int | None
    responses: int
    reward: RewardView
    vs_parent: ComparisonView | None


class SegmentView(_View):
    """One configured segment's adapter lineage (GET /admin/adapters)."""

    segment: str
    learner: str
    serving: int | None
    policy_version: int
    paused: bool
    versions: int
    latest: LatestVersion | None


class AdaptersView(_View):
    object: Literal["adapters"] = "adapters"
    adapters: str  # none | shared | segment
    base_version: int
    segments: list[SegmentView]
    settled: bool | MISSING = MISSING


class StatusView(_View):
    status: str
    servable: bool
    description: str


class StatusList(_View):
    object: Literal["list"] = "list"
    data: list[StatusView]


class Imported(_View):
    """POST /admin/weights: the swap, then the copy's digest and the files taken or left behind."""

    object: Literal["policy_version"] = "policy_version"
    version: int
    parent: int
    swap_ms: Number
    held_ms: Number
    checkpoint_sha256: str
    completed: list[str]
    left_behind: list[str]


class RolledBack(_View):
    """POST /admin/rollback; `segment` only where one segment's lineage moved."""

    object: Literal["rollback"] = "rollback"
    version: int
    previous: int
    rolled_back: list[int]
    swap_ms: Number
    held_ms: Number
    segment: str | MISSING = MISSING


# -- learning (server/edge/admin/learning.py) ------------------------------------------------------------
class LearningSwitch(_View):
    """POST /admin/learning/pause and /resume; `segment` only where one segment's lane was switched."""

    object: Literal["learning"] = "learning"
    learner: str
    paused: bool
    changed: bool
    segment: str | MISSING = MISSING


class BucketView(_View):
    """One time bucket of the reward series: its start (unix seconds) and reward rate."""

    t: Number
    n: int
    positive: int
    rate: float | None
    low: Number
    high: Number


class DriftView(_View):
    """GET /admin/drift: the detectors' state (monitor/drift.py `state`), alarms, segments, series."""

    object: Literal["drift"] = "drift"
    window_seconds: Number
    detector: str
    delta: Number
    threshold: Number
    last_feedback_id: int | None
    overall: dict[str, Any]
    segment_key: str | None
    segments_evicted: int
    segments: dict[str, dict[str, Any]]
    alarms: list[dict[str, Any]]
    series: list[BucketView]


class VersionLearningView(_View):
    version: int
    responses: int
    reward: RewardView
    behaviours: dict[str, RewardView]  # each behaviour rule: its served rate


class MovingPointView(_View):
    index: int
    version: int
    reward: Number


class SegmentLearningView(_View):
    """One segment of GET /admin/learning (the dashboard's learning panel)."""

    segment: str
    window: int
    responses: int
    ratings: int
    versions: list[VersionLearningView]
    moving: list[MovingPointView]


class LearningReport(_View):
    object: Literal["learning"] = "learning"
    window: int
    max_responses: int
    behaviours: list[str]
    data: list[SegmentLearningView]


class WindowPaceView(_View):
    seconds: Number
    arriving: Number
    trained: Number | None
    pace: Number | None
    seconds_per_rating: Number | None
    measured_seconds: Number
    full: bool


class LanePaceView(_View):
    segment: str | None
    lane: str
    cursor: int
    answered: bool
    paused: bool
    behind: bool
    behind_since: Number | None
    refused_steps: int
    backlog: int
    backlog_capped: bool
    short: WindowPaceView
    long: WindowPaceView


class LearnerPaceView(_View):
    """The learner's pace at the last check (server/control/learner_watch.py)."""

    at: Number
    short_seconds: Number
    long_seconds: Number
    behind_pace: Number
    behind_backlog: int
    behind: bool
    lanes: list[LanePaceView]


class LearnerStatusView(_View):
    """The co-located learner (GET /admin/learner, stats' `learner`): its health's keys, then its status's
    (the learner's own, open-ended), `error` when it did not answer, and its pace last."""

    model_config = ConfigDict(extra="allow")  # the learner status's keys

    object: Literal["learner"] | MISSING = MISSING
    running: bool
    state: str
    restarts: int | MISSING = MISSING
    last_error: str | None | MISSING = MISSING
    error: str | MISSING = MISSING
    pace: LearnerPaceView | None

    @model_serializer(mode="wrap")
    def _last(self, handler):  # no return annotation: /openapi.json keeps the fields' schema
        body = handler(self)
        for key in ("error", "pace"):  # after the status's keys, where they always were
            if key in body:
                body[key] = body.pop(key)
        return body


class StatsView(_View):
    object: Literal["stats"] = "stats"
    serving: int
    engine: str
    model: str
    uptime_seconds: int
    learning_paused: bool
    counts: dict[str, int]
    rating_rate: float | None
    learner: LearnerStatusView


# -- release (server/edge/admin/release.py) --------------------------------------------------------------
class TrafficView(_View):
    version: int
    responses: int
    ratings: int
    positive: int
    rate: float | None  # None: no ratings


class DecisionView(_View):
    action: str
    reason: str
    p_worse: Number | None


class CandidateView(_View):
    version: int
    status: str
    loaded: bool
    traffic: TrafficView
    live: TrafficView
    evaluation: str  # running | passed | failed | none
    decision: DecisionView | None  # the gate's verdict at its last pass


class LineageView(_View):
    mode: str
    serving: int | None  # None: the base weights
    candidate: CandidateView | None


class ReleaseView(_View):
    """GET /admin/release; without a gate (immediate mode, evaluation off) no `configured_segments` or
    `canary_fraction`."""

    object: Literal["release"] = "release"
    mode: str
    segments: dict[str, str]
    configured_segments: dict[str, str] | MISSING = MISSING
    canary_fraction: Number | MISSING = MISSING
    serving: int
    candidate: CandidateView | None
    evaluating: int | None
    lineages: dict[str, LineageView]
    gate: bool
    settled: bool | MISSING = MISSING


class EvaluationView(_View):
    """A version's latest evaluation: each check as written (name, value, live, base, bound, passed)."""

    object: Literal["evaluation"] = "evaluation"
    version: int
    live_version: int | None
    passed: bool
    failed: list[str]
    checks: list[dict[str, Any]]
    seconds: Number
    engine_seconds: Number | None
    created: float  # unix seconds


class EvaluationList(_View):
    object: Literal["list"] = "list"
    data: list[EvaluationView]


# -- alarms and episodes (server/edge/admin/alarms.py, episodes.py) --------------------------------------
class AlarmSettings(_View):
    traits: list[str]
    min_ratings: int
    min_gain: Number
    explained_share: Number
    auto_hold: bool
    check_seconds: Number


class AlarmEvent(_View):
    """A `reward_hacking` operator event."""

    id: int
    version: int | None
    trait: Any
    detail: dict[str, Any]
    at: float  # unix seconds


class AlarmList(_View):
    """GET /admin/alarms: the settings (None: alarms off), the recent events, each judged version's
    latest judgement (server/control/alarms.py `detail`)."""

    object: Literal["list"] = "list"
    enabled: bool
    settings: AlarmSettings | None
    events: list[AlarmEvent]
    data: list[dict[str, Any]]


class TurnBody(_View):
    id: str
    turn: int
    policy_version: int
    prompt_tokens: int
    completion_tokens: int
    observation_tokens: int | None
    linked_by: str | None
    finish_reason: str
    tool_calls: list[str]
    reward: Number | None
    other_branches: int
    created_at: str  # ISO 8601


class EpisodeBody(_View):
    """An episode ending at `last_turn` (GET /admin/episodes/{response_id})."""

    object: Literal["episode"] = "episode"
    id: str
    last_turn: str
    key_id: str
    complete: bool
    turns: list[TurnBody]
    turn_count: int
    tokens: int
    tool_calls: int
    reward: Number | None
    ratings: int
    versions: list[int]
    branches: int


class EpisodeList(_View):
    object: Literal["list"] = "list"
    data: list[EpisodeBody]
