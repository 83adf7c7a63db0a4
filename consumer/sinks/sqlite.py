"""The embedded default sink: one SQLite file, no set-up.

Table layout (created if absent; an existing table must have these declared types)::

    chunk_id           TEXT    NOT NULL  -- PRIMARY KEY (chunk_id, row_index)
    row_index          INTEGER NOT NULL
    source_message_id  TEXT
    <passthrough>      see below (NULL where the input was null)
    <outputs>          see below
    model_name         TEXT
    model_version      TEXT
    processed_at       TEXT    -- ISO-8601 UTC, microseconds: 2024-05-01T12:00:00.123456+00:00

The declared type names the column's dtype, with SQLite's usual affinity: ``INT64``, ``UINT32``...
(INTEGER), ``FLOAT32``, ``FLOAT64`` (REAL: an 8-byte double, exact for float32 values),
``BOOLEAN`` (0/1), ``TEXT``, ``BLOB`` (bytes). A vector column (``dim > 0``) is declared
``BLOB_F32(384)`` (``F16``, ``F64``, ``I8``...``I64``, ``UI8``..., ``B8`` for bool) and holds
``dim`` little-endian values of that type, so a 384-dim float32 vector is a 1,536-byte BLOB.
Read it back with ``numpy.frombuffer(blob, dtype="<f4")`` (``"<f8"``, ``"<i8"``, ``"u1"``...).

The database runs in WAL mode (readers never block the writer) with ``synchronous=FULL``: each
``write`` is one transaction, durable when it returns. ``INSERT OR IGNORE`` on the primary key
makes writes idempotent: a row already present is left as it is.

Text is stored as is, U+0000 included (SQLite's TEXT is length-counted); bytes are BLOBs.

Faults (:func:`classify_sqlite_error`): "database is locked" / busy past the busy timeout, a
full disk (``SQLITE_FULL``) and I/O errors raise :class:`~consumer.sinks.base.SinkUnavailable`
(the pipeline retries the same write; the failed transaction was rolled back, so the sink is
usable as it is); a value SQLite refuses (a constraint, a value too big, one it cannot bind)
raises :class:`~consumer.sinks.base.RowsRejected`; anything else plain
:class:`~consumer.sinks.base.SinkError`.
"""

from __future__ import annotations

import asyncio
import errno
import re
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    TableMismatch,
    TableSpec,
    check_keys,
    column_values,
    first_line,
    in_thread,
    null_mask,
    table_columns,
    utc,
)

_T = TypeVar("_T")
_BUSY_TIMEOUT_S = 30.0

#: Primary result codes (the low byte of ``sqlite_errorcode``) of faults that pass.
_TRANSIENT_CODES = frozenset(
    {
        5,  # SQLITE_BUSY: "database is locked" past the busy timeout
        6,  # SQLITE_LOCKED
        10,  # SQLITE_IOERR (a full disk often shows as IOERR_WRITE)
        13,  # SQLITE_FULL: "database or disk is full"
    }
)
_TRANSIENT_WORDS = re.compile(r"database is locked|database table is locked|disk is full", re.I)
_BINDING = re.compile(r"Error binding parameter :?(\d+)")


def classify_sqlite_error(
    exc: sqlite3.Error | OverflowError, doing: str = "", *, columns: Sequence[str] = ()
) -> SinkError:
    """The sink error for an SQLite error: :class:`SinkUnavailable` for busy/locked, a full
    disk or an I/O error; :class:`RowsRejected` for a value SQLite refuses (constraint, too
    big, unbindable: ``columns`` names the statement's parameters so the column is named);
    else :class:`SinkError`. The message is ``doing`` then SQLite's own words."""
    words = first_line(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    bound = _BINDING.search(words)
    if bound is not None and 0 < int(bound.group(1)) <= len(columns):
        words += f" (column {columns[int(bound.group(1)) - 1]!r})"
    message = f"{doing}: {words}" if doing else words
    if (isinstance(code, int) and code & 0xFF in _TRANSIENT_CODES) or (
        code is None and _TRANSIENT_WORDS.search(words)
    ):
        return SinkUnavailable(message)
    if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError | OverflowError):
        return RowsRejected(message)
    if bound is not None:  # a value of a type SQLite cannot store
        return RowsRejected(message)
    return SinkError(message)


def _quote(name: str) -> str:
    if "\x00" in name:
        raise SinkError(f"identifier {name!r} contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


_VECTOR_CODES = {"bool": "B8", "float16": "F16", "float32": "F32", "float64": "F64"}


def _sql_type(col: ColumnSpec) -> str:
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


def _layout(table: TableSpec) -> list[tuple[str, str]]:
    """``(column, declared type)`` in table order."""
    middle = [(c.name, _sql_type(c)) for c in table_columns(table)]
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


def _column_cells(rows: ResultRows, col: ColumnSpec) -> list[Any]:
    """The column as a list of SQLite values, ``None`` where null."""
    values = column_values(rows, col)
    cells: list[Any]
    if col.dim:
        dtype = np.dtype("u1") if col.dtype == "bool" else np.dtype(col.dtype).newbyteorder("<")
        blob = np.ascontiguousarray(values, dtype=dtype).tobytes()
        width = col.dim * dtype.itemsize
        cells = [blob[i : i + width] for i in range(0, len(blob), width)]
    elif col.dtype in TEXT_DTYPES or col.dtype == "bytes":
        cells = list(values)
    elif col.dtype == "bool":
        cells = values.astype(np.int64).tolist()
    else:
        cells = values.tolist()
    mask = null_mask(rows, col.name)
    if mask is not None:
        for i in np.flatnonzero(mask).tolist():
            cells[i] = None
    return cells


def _records(table: TableSpec, rows: ResultRows) -> list[tuple[Any, ...]]:
    """One parameter tuple per row, in layout order."""
    check_keys(rows)
    at = utc(rows.processed_at).isoformat(timespec="microseconds")
    columns: list[list[Any]] = [
        list(rows.chunk_id),
        rows.row_index.tolist(),
        list(rows.source_message_id),
        *(_column_cells(rows, c) for c in table_columns(table)),
    ]
    tail = (rows.model_name, rows.model_version, at)
    return [(*r, *tail) for r in zip(*columns, strict=True)]


class SqliteSink:
    """Result rows in the table ``TableSpec.name`` of the SQLite database at ``path``."""

    def __init__(self, path: Path, *, busy_timeout_s: float = _BUSY_TIMEOUT_S) -> None:
        self._path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._names: tuple[str, ...] = ()
        self._conn: sqlite3.Connection | None = None
        self._table: TableSpec | None = None
        self._insert = ""
        self._delete = ""
        self._lock = asyncio.Lock()  # one statement stream at a time on the connection
        # Every use of the connection happens on this one thread: SQLite connections shared
        # across threads (even one at a time) failed here with "bad parameter or other API
        # misuse" under load.
        self._db_thread = ThreadPoolExecutor(1, thread_name_prefix="rowbatch-sqlite")

    async def _on_db_thread(self, func: Callable[..., _T], *args: Any) -> _T:
        """``func(*args)`` on the connection's thread; if cancelled, still waits for it."""
        future = asyncio.get_running_loop().run_in_executor(self._db_thread, func, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])
            raise

    async def open(self, table: TableSpec) -> None:
        layout = _layout(table)
        names = ", ".join(_quote(n) for n, _ in layout)
        marks = ", ".join("?" for _ in layout)
        async with self._lock:
            if self._conn is not None:
                raise SinkError("SqliteSink is already open")
            try:
                self._conn = await self._on_db_thread(self._connect, table, layout)
            except (sqlite3.Error, OSError) as exc:
                doing = f"SQLite sink open of {self._path}"
                fault: SinkError
                if isinstance(exc, sqlite3.Error):
                    fault = classify_sqlite_error(exc, doing)
                    if isinstance(fault, RowsRejected):  # no rows yet: a plain error
                        fault = SinkError(str(fault))
                elif _disk_full(exc):
                    fault = SinkUnavailable(f"{doing}: {first_line(exc)}")
                else:
                    fault = SinkError(f"{doing}: {first_line(exc)}")
                raise fault from exc
            self._table = table
            self._names = tuple(n for n, _ in layout)
            self._insert = f"INSERT OR IGNORE INTO {_quote(table.name)} ({names}) VALUES ({marks})"  # noqa: S608
            self._delete = f"DELETE FROM {_quote(table.name)} WHERE chunk_id = ?"  # noqa: S608

    def _connect(self, table: TableSpec, layout: list[tuple[str, str]]) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self._path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            self._prepare(conn, table, layout)
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(
        self, conn: sqlite3.Connection, table: TableSpec, layout: list[tuple[str, str]]
    ) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise SinkError(f"{self._path}: SQLite refused WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        columns = ", ".join(f"{_quote(n)} {t}" for n, t in layout)

        def create(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {_quote(table.name)} "
                f"({columns}, PRIMARY KEY (chunk_id, row_index))"
            )
            self._check(conn, table.name, layout)

        sqlite_transaction(conn, create)

    def _check(self, conn: sqlite3.Connection, name: str, layout: list[tuple[str, str]]) -> None:
        """The existing table has every column with the declared type and the right key."""
        info = conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
        found = {str(r[1]).casefold(): r for r in info}  # cid, name, type, notnull, dflt, pk
        where = f"{self._path}: existing table {name!r}"
        for column, sql_type in layout:
            row = found.pop(column.casefold(), None)
            if row is None:
                raise TableMismatch(f"{where} lacks column {column!r}", column=column)
            if str(row[2]).upper() != sql_type:
                raise TableMismatch(
                    f"{where}: column {column!r} is {row[2]!r}, expected {sql_type}",
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

    async def write(self, rows: ResultRows) -> None:
        table = self._require()
        if len(rows) == 0:
            return
        records = await in_thread(_records, table, rows)
        await self._run("write", lambda conn: conn.executemany(self._insert, records))

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self._require()
        if chunk_ids:
            params = [(c,) for c in chunk_ids]
            await self._run("delete_chunks", lambda conn: conn.executemany(self._delete, params))

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            self._table = None
            if conn is not None:
                await self._on_db_thread(conn.close)
            self._db_thread.shutdown(wait=True)

    def _require(self) -> TableSpec:
        if self._conn is None or self._table is None:
            raise SinkError("SqliteSink is not open")
        return self._table

    async def _run(self, what: str, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """``work`` in one transaction on a worker thread, committed before returning; an
        SQLite error raised classified (:func:`classify_sqlite_error`)."""
        async with self._lock:
            conn = self._conn
            if conn is None:
                raise SinkError("SqliteSink is closed")
            try:
                return await self._on_db_thread(sqlite_transaction, conn, work)
            except (sqlite3.Error, OverflowError) as exc:
                doing = f"SQLite sink {what} on {self._path}"
                raise classify_sqlite_error(exc, doing, columns=self._names) from exc


def sqlite_transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], _T]) -> _T:
    """``work(conn)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled back if it raises)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
    except BaseException:
        # SQLite may have rolled back already (a full disk, an I/O error): a second ROLLBACK
        # would fail and hide the cause.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


__all__ = ["SqliteSink", "classify_sqlite_error", "sqlite_transaction"]
