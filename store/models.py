"""SQLAlchemy 2.0 typed models: policy_versions, responses, feedback, learner_cursor, learner_control,
operator_events, api_keys.

The schema is owned by the Alembic migrations in `migrations/`; these classes mirror it for queries.
Token arrays are binary columns (see `codec`); a version's status is a `VersionStatus` in Python and
its string value in the database (`StatusColumn`: an unknown value is refused on the way in).
"""

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, LargeBinary, SmallInteger, String, Text
from sqlalchemy import UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from liveloop.store.status import VersionStatus


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class StatusColumn(TypeDecorator):
    """`policy_versions.status`: VARCHAR(16) in the database, `VersionStatus` in Python."""

    impl = String(16)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else VersionStatus(value).value

    def process_result_value(self, value: str | None, dialect: Any) -> VersionStatus | None:
        return None if value is None else VersionStatus(value)


class Base(DeclarativeBase):
    pass


class PolicyVersion(Base):
    __tablename__ = "policy_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    parent: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.version"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    checkpoint_sha256: Mapped[str | None] = mapped_column(String(64))
    learner_step: Mapped[int] = mapped_column(Integer, default=0)
    samples_used: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[VersionStatus] = mapped_column(StatusColumn(), default=VersionStatus.SERVING)
    note: Mapped[str | None] = mapped_column(Text)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)  # an operator keeps its checkpoint
    pruned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # checkpoint deleted
    segment: Mapped[str | None] = mapped_column(String(64), index=True)  # None: base weights; else that segment's adapter


class Response(Base):
    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    api_key_id: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(128))
    policy_version: Mapped[int] = mapped_column(ForeignKey("policy_versions.version"), index=True)
    endpoint: Mapped[str] = mapped_column(String(16))
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)
    response_ids: Mapped[bytes] = mapped_column(LargeBinary)
    behavior_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    action_mask: Mapped[bytes | None] = mapped_column(LargeBinary)
    finish_reason: Mapped[str] = mapped_column(String(16))
    temperature: Mapped[float] = mapped_column(Float)
    top_p: Mapped[float] = mapped_column(Float)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    request_meta: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    segment: Mapped[str | None] = mapped_column(String(64), index=True)  # the adapter segment that served it
    # [[start, end, version], ...] over the response's token indexes (see ResponseRecord.version_spans);
    # SQL NULL, not JSON null, when all of it came from policy_version
    version_spans: Mapped[list[list[int]] | None] = mapped_column(JSON(none_as_null=True))


class Feedback(Base):
    """One rating per (response, api key). A change of mind updates the row in place (same id,
    `revisions` + 1): the learner, which reads feedback in id order past its cursor, trains the
    latest value if it has not reached the row yet, and never trains the pair twice."""

    __tablename__ = "feedback"
    __table_args__ = (
        UniqueConstraint("response_id", "api_key_id", name="uq_feedback_response_key"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    response_id: Mapped[str] = mapped_column(ForeignKey("responses.id"), index=True)
    api_key_id: Mapped[str] = mapped_column(String(32), index=True)
    reward: Mapped[int] = mapped_column(SmallInteger)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    revisions: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class LearnerCursor(Base):
    __tablename__ = "learner_cursor"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_feedback_id: Mapped[int] = mapped_column(Integer, default=0)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LearnerControl(Base):
    """An operator's switch for a learner (by cursor name): paused learners neither train nor publish."""

    __tablename__ = "learner_control"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class OperatorEvent(Base):
    """What operators and the monitor did: pause, resume, rollback, alarm, guard_rollback."""

    __tablename__ = "operator_events"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    version: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class ApiKey(Base):
    """What operators decided about one API key (by its digest): quarantined keys' ratings are kept
    but never trained on or replayed; `forgotten_at` records a forget (its rows are deleted)."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    quarantined: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text)
    forgotten_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
