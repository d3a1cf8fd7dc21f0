"""The admin API's bodies: its requests (swaps, rollbacks, pauses, forgetting and quarantining keys) and
the typed responses of the keys' and the fleet's routes and of pinning (server/edge/admin/)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from liveloop.server.control.operations import KeyRow
from liveloop.server.edge.protocol import INT32_MAX, Text, _Strict
from liveloop.store.replicas import ReplicaRow


class SwapRequest(_Strict):
    path: Annotated[Text, Field(min_length=1, max_length=4096)]
    note: Annotated[Text, Field(max_length=1000)] | None = None


Segment = Annotated[Text, Field(min_length=1, max_length=256)]  # an adapter segment's name (`[learner] segments`)


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
