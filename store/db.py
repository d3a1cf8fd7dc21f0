"""Database engines: SQLite in WAL mode with durable commits and a busy timeout, or PostgreSQL."""

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from liveloop.store.config import StoreConfig


def make_engine(config: StoreConfig) -> Engine:
    url = make_url(config.url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        synchronous = config.sqlite_synchronous.upper()

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    raise ValueError(f"store.url: unsupported database {url.get_backend_name()!r} (sqlite or postgresql)")
