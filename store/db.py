"""Database engines: SQLite in WAL mode with durable commits, a busy timeout and `secure_delete` (a
deleted row's bytes are overwritten with zeros, not left in free space: store/rights.py), or PostgreSQL.

`immediate(engine)` is the same engine for transactions that must hold the write lock from their first
statement: on SQLite it opens them with `BEGIN IMMEDIATE` (a deferred transaction that reads and then
writes can be overtaken between the two, or fail at once with "database is locked"); on PostgreSQL it
changes nothing (those transactions take their locks themselves, store/versions.py).

`Database` is the one database every part of the store works on (its engine and the sessions a part
opens); `Part` is the one way a cohesive group of queries is added to the store (store/store.py builds
each part once over the `Database`).

A SQLite store is private whatever the umask (liveloop/private.py): its directory, when the store makes
it, is 0700, and the database file is created 0600 before SQLite opens it (SQLite gives its `-wal`,
`-shm` and `-journal` files the database file's mode); an existing one, and its side files, are narrowed
to 0600."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from liveloop.private import create_private, private_dir, sqlite_files, tighten
from liveloop.store.config import StoreConfig


IMMEDIATE = "liveloop_immediate"  # the execution option that asks for BEGIN IMMEDIATE


def dialect_insert(dialect: str, model: Any) -> Any:
    """An INSERT of `model` that takes an ON CONFLICT clause, in the store's dialect ("postgresql", or
    SQLite's)."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(model)


def immediate(engine: Engine) -> Engine:
    """`engine` (same pool) whose transactions take SQLite's write lock when they begin."""
    return engine.execution_options(**{IMMEDIATE: True})


@contextlib.contextmanager
def busy_timeout(driver_connection: Any, ms: int) -> Iterator[None]:
    """SQLite: inside the block this driver connection waits at most `ms` for a lock (a connection
    setting, restored after; set on the driver's connection, so no transaction begins for it)."""
    before = driver_connection.execute("PRAGMA busy_timeout").fetchone()[0]
    driver_connection.execute(f"PRAGMA busy_timeout = {int(ms)}")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            driver_connection.execute(f"PRAGMA busy_timeout = {int(before)}")


def private_sqlite(files: list[Path]) -> None:
    """The database file 0600 before SQLite opens it (made so, or narrowed), its side files narrowed."""
    db = private_dir(files[0].parent) / files[0].name
    try:
        os.close(create_private(db))
    except FileExistsError:  # an existing store (or a symlink to one: SQLite opens what it names)
        pass
    for path in files:
        tighten(path)


def make_engine(config: StoreConfig) -> Engine:
    url = make_url(config.url)
    if url.get_backend_name() == "sqlite":
        files = sqlite_files(config.url)
        if files:
            private_sqlite(files)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        synchronous = config.sqlite_synchronous.upper()

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA secure_delete=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):  # noqa: ANN001
            if conn.get_execution_options().get(IMMEDIATE):
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5)
    raise ValueError(f"store.url: unsupported database {url.get_backend_name()!r} (sqlite or postgresql)")


# pg_advisory_xact_lock key every version-state transaction takes on PostgreSQL ("llvs")
VERSION_LOCK = 0x6C6C7673


class Database:
    """One database: its engine and how a part opens a session on it. `session()`: a read (or a plain
    write); `write_session`: a session whose transactions hold the write lock from their first
    statement; `writing`: the engine of the write path's Core transactions (the same lock);
    `version_transaction(term)`: THE version-state transaction (store/versions.py)."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self.engine = make_engine(config)
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        self.write_session = sessionmaker(immediate(self.engine), expire_on_commit=False)
        self.writing = immediate(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def version_transaction(self, term: int | None = None) -> Iterator[Session]:
        """A session in a version-state transaction that holds the write lock from its start (PostgreSQL:
        the version-state advisory lock too); with `term`, a leader's: StaleLeader (nothing written)
        unless the leader lease is still in it (store/lease.py `fenced`)."""
        from liveloop.store.lease import fenced

        with self.write_session.begin() as s:
            if self.dialect == "postgresql":
                s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": VERSION_LOCK})
            if term is not None:
                fenced(s, term)
            yield s

    def close(self) -> None:
        self.engine.dispose()


class Part:
    """A cohesive group of the store's queries over the one `Database`. To add a part: subclass this,
    take what it needs in `__init__` (the database first), and build it once in `Store.__init__`."""

    def __init__(self, db: Database):
        self.db = db
        self._session = db.session
        self._write_session = db.write_session

    @property
    def dialect(self) -> str:
        return self.db.dialect
