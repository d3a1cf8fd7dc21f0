"""Bulk inserts at the driver's pace for the write path: rows as Core dicts (one dict per row, the
same keys, named after the table's columns) into one table, inside the caller's transaction.

PostgreSQL: `COPY ... FROM STDIN` on the psycopg connection under the SQLAlchemy one, which skips
the per-row statement work of INSERT (parse, bind, execute, a protocol message each). Other
databases (SQLite): one driver `executemany` of tuples that already hold what SQLAlchemy's bind
processors would make of each value, which skips the per-row parameter processing of a Core
executemany. Either way the rows commit or roll back with the rest of the batch, and read back
exactly as if a Core insert had written them (JSON columns: JSON `null` for None unless the column
says `none_as_null`).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from psycopg.types.json import Json
from sqlalchemy import JSON, Connection, LargeBinary, Table


def insert_rows(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        _copy(conn, table, rows)
    else:
        _executemany(conn, table, rows)


def _copy(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    names = list(rows[0])
    rules = [_json_rule(table.c[name].type) for name in names]
    driver = conn.connection.driver_connection
    with driver.cursor() as cur, cur.copy(f"COPY {_quoted(conn, table, names)} FROM STDIN") as copy:
        for row in rows:
            copy.write_row([row[name] if rule is None else rule(row[name]) for name, rule in zip(names, rules)])


def _executemany(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    names = list(rows[0])
    values = itemgetter(*names)
    processed = [(k, p) for k, name in enumerate(names) if (p := _processor(conn, table.c[name].type)) is not None]
    params = []
    for row in rows:
        out = list(values(row))
        for k, process in processed:
            out[k] = process(out[k])
        params.append(tuple(out))
    assert conn.dialect.paramstyle == "qmark", conn.dialect.paramstyle
    marks = ", ".join("?" for _ in names)
    conn.exec_driver_sql(f"INSERT INTO {_quoted(conn, table, names)} VALUES ({marks})", params)


def _quoted(conn: Connection, table: Table, names: list[str]) -> str:
    quote = conn.dialect.identifier_preparer.quote
    return f"{quote(table.name)} ({', '.join(quote(name) for name in names)})"


def _processor(conn: Connection, column_type: Any) -> Callable[[Any], Any] | None:
    """SQLAlchemy's bind processor for this column on this dialect (None: the value goes as it is).
    Binary columns go as bytes, which every driver takes."""
    if isinstance(column_type, LargeBinary):
        return None
    process = column_type.dialect_impl(conn.dialect).bind_processor(conn.dialect)
    return None if process is None else _last_one(process)


def _last_one(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`process`, remembering its last argument: a batch's rows share one `created_at` object (and
    mostly None for JSON), and formatting a timestamp costs more than the rest of a row."""
    last: list[Any] = [object(), None]

    def cached(value: Any) -> Any:
        if value is not last[0]:
            last[0], last[1] = value, process(value)
        return last[1]

    return cached


def _json_rule(column_type: Any) -> Callable[[Any], Any] | None:
    """How a value of this column goes into COPY: None for plain columns, else a JSON wrapper."""
    if not isinstance(column_type, JSON):
        return None
    if column_type.none_as_null:
        return lambda value: None if value is None else Json(value)
    return Json
