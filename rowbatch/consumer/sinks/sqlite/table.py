"""The SQLite result table: each column's declared type, creating the table, and checking that
an existing one fits the spec."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from rowbatch.consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    SinkError,
    TableMismatch,
    TableSpec,
    table_columns,
)
from rowbatch.consumer.sinks.sqlite.db import sqlite_transaction

_VECTOR_CODES: Final = {"bool": "B8", "float16": "F16", "float32": "F32", "float64": "F64"}


def quote(name: str) -> str:
    """``name`` as an SQLite identifier."""
    if "\x00" in name:
        raise SinkError(f"identifier {name!r} contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def sql_type(col: ColumnSpec) -> str:
    """The declared type: it names the dtype (and a vector's dim), so an existing table can be
    checked exactly, while giving SQLite the usual affinity (INTEGER, REAL, TEXT, BLOB)."""
    if col.dim:
        code = _VECTOR_CODES.get(col.dtype) or col.dtype.replace("int", "I").upper()
        return f"BLOB_{code}({col.dim})"  # never contains INT/CHAR/TEXT: BLOB affinity
    if col.dtype in TEXT_DTYPES:
        return "TEXT"
    if col.dtype == "bytes":
        return "BLOB"
    if col.dtype == "bool":
        return "BOOLEAN"
    return col.dtype.upper()  # INT64, UINT8 (INTEGER affinity), FLOAT32 (REAL affinity)


def layout(table: TableSpec) -> list[tuple[str, str]]:
    """``(column, declared type)`` in table order."""
    middle = [(c.name, sql_type(c)) for c in table_columns(table)]
    folded = [name.casefold() for name, _ in middle]
    for name, _ in middle:
        if folded.count(name.casefold()) > 1:
            raise SinkError(f"column {name!r} differs from another only by case (SQLite folds it)")
    return [
        ("chunk_id", "TEXT"),
        ("row_index", "INTEGER"),
        ("source_message_id", "TEXT"),
        *middle,
        ("model_name", "TEXT"),
        ("model_version", "TEXT"),
        ("processed_at", "TEXT"),
    ]


def prepare(
    conn: sqlite3.Connection, path: Path, table: TableSpec, columns: list[tuple[str, str]]
) -> None:
    """WAL mode and ``synchronous=FULL`` on the database at ``path``; the table (``columns``:
    its :func:`layout`) created if absent, else checked."""
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        raise SinkError(f"{path}: SQLite refused WAL mode (got {mode})")
    conn.execute("PRAGMA synchronous=FULL")
    definitions = ", ".join(f"{quote(n)} {t}" for n, t in columns)

    def create(conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(table.name)} "
            f"({definitions}, PRIMARY KEY (chunk_id, row_index))"
        )
        _check(conn, f"{path}: existing table {table.name!r}", table.name, columns)

    sqlite_transaction(conn, create)


def _check(conn: sqlite3.Connection, where: str, name: str, columns: list[tuple[str, str]]) -> None:
    """The existing table has every column with the declared type and the right key."""
    info = conn.execute(f"PRAGMA table_info({quote(name)})").fetchall()
    found = {str(r[1]).casefold(): r for r in info}  # cid, name, type, notnull, dflt, pk
    for column, declared in columns:
        row = found.pop(column.casefold(), None)
        if row is None:
            raise TableMismatch(f"{where} lacks column {column!r}", column=column)
        if str(row[2]).upper() != declared:
            raise TableMismatch(
                f"{where}: column {column!r} is {row[2]!r}, expected {declared}",
                column=column,
            )
    key = sorted((int(r[5]), str(r[1])) for r in info if r[5])
    if [n for _, n in key] != ["chunk_id", "row_index"]:
        raise TableMismatch(
            f"{where} has primary key {[n for _, n in key]}, expected (chunk_id, row_index)",
            column="chunk_id",
        )
    for row in found.values():
        if row[3] and row[4] is None:
            raise TableMismatch(
                f"{where} has an extra NOT NULL column {row[1]!r} without a default",
                column=str(row[1]),
            )
