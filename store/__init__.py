"""The versioned-feedback store: every served response with its exact tokens, behavior logprobs and
policy version; the ratings users give; the policy versions; the learner's cursor; the operator's
switches and event log.

SQLAlchemy 2.0 models (`models`), the query API every other component uses (`store.Store`), the
batched group-commit writer the server logs through (`writer.BatchWriter`), the policy-version statuses
and their legal transitions (`status`), the one owner of version state (`versions`: every status
change and version number, each in one locked transaction), the release gate's evaluations and the
rated replies its alarms judge (`release`), the leases that name the fleet's leader (`lease`), and
Alembic migrations.
SQLite (WAL) by default, PostgreSQL by URL. Knows nothing of HTTP or torch.
"""

from liveloop.store.status import VersionNotFound
from liveloop.store.config import StoreConfig
from liveloop.store.conversations import MAX_CHAIN, ChainTooLong
from liveloop.store.release import InvalidEvaluation
from liveloop.store.lease import Leases, LeaseState
from liveloop.store.versions import RollbackRefused, ServingChanged, StaleLineage, VersionTaken
from liveloop.store.records import (
    EvaluationRecord,
    FeedbackRecord,
    InvalidVersionSpans,
    RatingEvent,
    ResponseRecord,
    StoredConversation,
    VersionRecord,
)
from liveloop.store.status import TransitionRefused, VersionStatus
from liveloop.store.store import ResponseNotFound, SchemaNotReady, Store
from liveloop.store.writer import BatchWriter, WriterDown, WriterFull, WriterHealth

__all__ = [
    "MAX_CHAIN",
    "BatchWriter",
    "ChainTooLong",
    "EvaluationRecord",
    "FeedbackRecord",
    "InvalidEvaluation",
    "InvalidVersionSpans",
    "Leases",
    "LeaseState",
    "ResponseNotFound",
    "RatingEvent",
    "ResponseRecord",
    "RollbackRefused",
    "ServingChanged",
    "SchemaNotReady",
    "Store",
    "StaleLineage",
    "StoreConfig",
    "StoredConversation",
    "TransitionRefused",
    "VersionNotFound",
    "VersionRecord",
    "VersionStatus",
    "VersionTaken",
    "WriterDown",
    "WriterFull",
    "WriterHealth",
]
