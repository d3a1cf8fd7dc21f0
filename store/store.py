"""The versioned-feedback store: a small facade over its parts, each a cohesive group of queries over the
one database (`Database`, store/db.py). A component is handed the part it uses (`store.feedback` for the
learner's feed, `store.versions` for the version control plane, ...), or names it: `store.<part>.<query>`.

Each part lives in the module of its name (`store.<part>` is store/<part>.py) and is a plain attribute
built once in `Store.__init__`:
- `versions`: version rows and learner cursors; every version-state move; checkpoints' pinning and
  pruning.
- `feedback`: served responses and their ratings, the group-commit write path, the
  learner's feed and the drift monitor's ratings.
- `keys`: quarantine and each key's ratings.
- `rights`: deletion, forgetting, retention.
- `release`: evaluations, traffic per version, rated replies.
- `operator`: learning pause and the operator event log.
- `fleet`: the deployment's id, the replica registry, the leader leases, fleet counts.
- `conversations`, `episodes`: what chat-shaped responses asked and answered; agents' trajectories.

To add a part: a `Part` subclass (store/db.py) built once here. The facade itself only opens, migrates
and closes the database. Parts import each other's modules and the leaves (codec, models, records,
status, version_rows), never the package `liveloop.store` or this facade (no import cycle).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

import liveloop.store.migrate as migrate
from liveloop.store.config import StoreConfig
from liveloop.store.conversations import ConversationQueries
from liveloop.store.db import Database
from liveloop.store.episodes import EpisodeQueries
from liveloop.store.release import ReleaseQueries
from liveloop.store.feedback import FeedbackQueries, ResponseNotFound
from liveloop.store.fleet import FleetQueries
from liveloop.store.keys import KeyQueries
from liveloop.store.versions import VersionQueries
from liveloop.store.operator import OperatorQueries
from liveloop.store.rights import RightsQueries

__all__ = ["ResponseNotFound", "SchemaNotReady", "Store"]


class SchemaNotReady(RuntimeError):
    """The database is not migrated to the current schema; run `liveloop store migrate`."""


class Store:
    def __init__(self, config: StoreConfig):
        self.config = config
        self.db = Database(config)
        self.versions = VersionQueries(self.db)
        self.feedback = FeedbackQueries(self.db)
        self.keys = KeyQueries(self.db)
        self.rights = RightsQueries(self.db)
        self.release = ReleaseQueries(self.db)
        self.operator = OperatorQueries(self.db)
        self.fleet = FleetQueries(self.db)
        self.conversations = ConversationQueries(self.db)
        self.episodes = EpisodeQueries(self.db)

    @property
    def engine(self):  # noqa: ANN201 (sqlalchemy.Engine)
        return self.db.engine

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def close(self) -> None:
        self.db.close()

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        with self.db.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def transaction(self) -> Session:
        """A session in a transaction (`with store.transaction() as s:`), for multi-table updates."""
        return self.db.session.begin()

    # -- schema -------------------------------------------------------------------------------
    def migrate(self) -> str | None:
        return migrate.upgrade(self.db.engine)

    def schema_revision(self) -> str | None:
        return migrate.current_revision(self.db.engine)

    def require_schema(self) -> None:
        current, head = self.schema_revision(), migrate.head_revision()
        if current != head:
            raise SchemaNotReady(
                f"database {self.db.engine.url.render_as_string(hide_password=True)} is at schema "
                f"{current or 'empty'}, expected {head}: run `liveloop store migrate`"
            )
