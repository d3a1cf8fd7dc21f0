"""The store's configuration section (`[store]`)."""

from dataclasses import dataclass, field
from typing import Literal

from liveloop.config_types import check_literals


@dataclass(frozen=True)
class StoreConfig:
    url: str = field(
        default="sqlite:///data/liveloop.db",
        metadata={"help": "SQLAlchemy URL: sqlite:///path (WAL) or postgresql+psycopg://user@host:port/db"},
    )
    auto_migrate: bool = field(
        default=True, metadata={"help": "run `store migrate` (Alembic upgrade to head) when the server starts"}
    )
    batch_max: int = field(default=512, metadata={"help": "most rows the writer commits in one transaction"})
    queue_max: int = field(
        default=8192, metadata={"help": "most writes waiting for the writer; beyond it requests get 503 + Retry-After"}
    )
    retain_days: float = field(
        default=0.0, metadata={"help": "delete responses and ratings older than this many days (0 = keep for ever)"}
    )
    retention_interval_seconds: float = field(
        default=3600.0, metadata={"help": "how often the server applies retain_days"}
    )
    write_deadline_seconds: float = field(
        default=10.0,
        metadata={"help": "a request waits at most this long for its write (503 + Retry-After beyond: not acknowledged, "
                  "though it may still land); the writer waits at most this long for a locked database, then fails "
                  "the whole batch"},
    )
    writer_stall_seconds: float = field(
        default=5.0, metadata={"help": "/healthz says degraded while the writer's oldest waiting write is older than this"}
    )
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = field(
        default="FULL", metadata={"help": "SQLite PRAGMA synchronous (FULL: a commit survives power loss)"}
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if self.batch_max < 1:
            raise ValueError("batch_max must be >= 1")
        if self.queue_max < 1:
            raise ValueError("queue_max must be >= 1")
        if self.write_deadline_seconds <= 0 or self.writer_stall_seconds <= 0:
            raise ValueError("write_deadline_seconds and writer_stall_seconds must be > 0")
        if self.retain_days < 0 or self.retention_interval_seconds <= 0:
            raise ValueError("retain_days must be >= 0 and retention_interval_seconds > 0")
