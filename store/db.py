"""Database engines: SQLite in WAL mode with durable commits, a busy timeout and `secure_delete` (a
deleted row's bytes are overwritten with zeros, not left in free space: store/rights.py), or PostgreSQL.

`immediate(engine)` is the same engine for transactions that must hold the write lock from their first
statement: on SQLite it opens them with `BEGIN IMMEDIATE` (a deferred transaction that reads and then
writes can be overtaken between the two, or fail at once with "database is locked"); on PostgreSQL it
changes nothing (those transactions take their locks themselves, store/lifecycle.py).

A SQLite store is private whatever the umask (liveloop/private.py): its directory, when the store makes
it, is 0700, and the database file is created 0600 before SQLite opens it (SQLite gives its `-wal`,
`-shm` and `-journal` files the database file's mode); an existing one, and its side files, are narrowed
to 0600."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from liveloop.private import create_private, private_dir, sqlite_files, tighten
from liveloop.store.config import StoreConfig


IMMEDIATE = "liveloop_immediate"  # the execution option that asks for BEGIN IMMEDIATE


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
