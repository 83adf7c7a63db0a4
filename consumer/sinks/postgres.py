"""Result rows in a PostgreSQL table, written with binary ``COPY`` and ``ON CONFLICT DO NOTHING``.

Table layout (created if absent, in ``schema``, which is created too if absent)::

    chunk_id           text NOT NULL           -- PRIMARY KEY (chunk_id, row_index)
    row_index          bigint NOT NULL
    source_message_id  text
    <passthrough>      see below (NULL where the input was null)
    <outputs>          see below
    model_name         text
    model_version      text
    processed_at       timestamptz

==========================================  ================  ==========================
``ColumnSpec.dtype``                        scalar            vector (``dim > 0``)
==========================================  ================  ==========================
``int8``...``int64``, ``uint8``...``uint32``  ``bigint``        ``bigint[]``
``float16``, ``float32``                    ``real``          ``real[]``
``float64``                                 ``double precision``  ``double precision[]``
``bool``                                    ``boolean``       ``boolean[]``
``object`` / ``str`` (text)                 ``text``          (not supported)
``bytes``                                   ``bytea``         (not supported)
==========================================  ================  ==========================

An existing table must have each of these columns with exactly this type and a primary key
(or unique index) on ``(chunk_id, row_index)``; extra columns are fine when nullable or
defaulted. Otherwise ``open`` raises :class:`~consumer.sinks.base.TableMismatch` naming the
column. Concurrent ``open`` calls (many replicas) serialise on an advisory lock.

A ``write`` is one transaction: the rows are encoded (vectorised, in a worker thread) into
PostgreSQL's binary ``COPY`` format, copied into a per-connection temporary staging table
(``ON COMMIT DELETE ROWS``), then ``INSERT INTO target SELECT ... FROM staging ON CONFLICT
(chunk_id, row_index) DO NOTHING``. Rows already present are left as they are.

If the connection drops (``OperationalError`` with the connection broken), the operation is
retried once on a fresh connection; the retry is safe since writes and deletes are idempotent.

Faults (:func:`classify_pg_error`, by SQLSTATE):

* :class:`~consumer.sinks.base.SinkUnavailable` (the pipeline retries the same write later):
  the connection is lost or cannot be made (no SQLSTATE, class ``08``; connection refused,
  server starting up or shutting down ``57P01``-``57P03``), serialization failure ``40001``,
  deadlock ``40P01``, too many connections / out of resources (class ``53``), a read-only
  server after a failover ``25006``, a lock timeout ``55P03``. The broken or suspect connection
  is dropped, so the next call reconnects (a new staging table; nothing half-done survives,
  the failed transaction was rolled back).
* :class:`~consumer.sinks.base.RowsRejected` (the pipeline bisects and dead-letters): data
  exceptions (class ``22``) and integrity violations (class ``23``), with the database's first
  line of message and the column when it names one. Text containing U+0000, which PostgreSQL
  cannot store in ``text``, is named as such (code ``text_contains_nul``); the check runs only
  once the server refused the write (``22021``/``22P05``), so the happy path pays nothing.
* :class:`~consumer.sinks.base.SinkError` otherwise: configuration problems (class ``42``
  undefined table/column or ``42501`` insufficient privilege, class ``28`` authentication,
  ``3D000`` no such database).

Messages name ``host:port/dbname``, never the DSN or its password.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain, repeat
from typing import Any, Final, TypeVar

import numpy as np
import psycopg
from numpy.typing import NDArray
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

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
    null_mask,
    table_columns,
    utc,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_Conn = psycopg.AsyncConnection[Any]

_SIGNATURE: Final = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
_TRAILER: Final = b"\xff\xff"
_NULL: Final = b"\xff\xff\xff\xff"
_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_SLICE_ROWS: Final = 2_000  # rows encoded per COPY write
_STAGING: Final = "rowbatch_staging"
_VECTOR_COMMENT: Final = "rowbatch vector: "

# numpy dtype -> (format_type name, big-endian binary format, element type oid)
_NUMERIC: Final[dict[str, tuple[str, str, int]]] = {
    "bool": ("boolean", "?", 16),
    **dict.fromkeys(("int8", "int16", "int32", "int64"), ("bigint", ">i8", 20)),
    **dict.fromkeys(("uint8", "uint16", "uint32"), ("bigint", ">i8", 20)),
    "float16": ("real", ">f4", 700),
    "float32": ("real", ">f4", 700),
    "float64": ("double precision", ">f8", 701),
}

Cells = Sequence[bytes | memoryview]  # one binary COPY field (length prefix included) per row

# --- fault classification ---------------------------------------------------------------------

#: SQLSTATE classes of faults that pass: connection exception, insufficient resources,
#: operator intervention (shutdown, cannot connect now, query canceled), system error.
_TRANSIENT_CLASSES: Final = frozenset({"08", "40", "53", "57", "58"})
#: ... except these, which retrying cannot cure.
_LASTING_STATES: Final = frozenset(
    {
        "40002",  # transaction_integrity_constraint_violation: about the data
        "53400",  # configuration_limit_exceeded
        "57P04",  # database_dropped
        "58P01",  # undefined_file
        "58P02",  # duplicate_file
    }
)
#: Single states that pass: read-only (a standby after failover), lock and object in use.
_TRANSIENT_STATES: Final = frozenset({"25006", "55P03", "55006"})
#: Data exceptions and integrity violations: the rows, not the database, are at fault.
_REJECTED_CLASSES: Final = frozenset({"22", "23"})
_REJECTED_STATES: Final = frozenset({"40002"})
#: Encoding refusals: how the server answers U+0000 in text.
_ENCODING_STATES: Final = frozenset({"22021", "22P05"})
#: Without an SQLSTATE (a failed connection attempt), the libpq words of a configuration
#: problem; any other such failure (refused, timed out, starting up, too many clients) passes.
_CONFIG_WORDS: Final = re.compile(
    r"authentication failed|pg_hba\.conf|no password supplied|does not exist"
    r"|permission denied|does not support SSL|certificate|invalid (?:connection option|sslmode)",
    re.IGNORECASE,
)
_COPY_COLUMN: Final = re.compile(r"^COPY [^,]*, line \d+, column (.+?)(?::|$)", re.MULTILINE)


def _column_of(exc: psycopg.Error) -> str | None:
    """The column the server's error names (integrity violations) or, for a COPY, where it
    stopped (``COPY staging, line 3, column title: ...``)."""
    with contextlib.suppress(Exception):  # diag of a connection error has nothing to read
        if exc.diag.column_name:
            return exc.diag.column_name
        found = _COPY_COLUMN.search(exc.diag.context or "")
        if found:
            return found.group(1)
    return None


def classify_pg_error(exc: psycopg.Error, doing: str = "", *, secret: str = "") -> SinkError:
    """The sink error for a psycopg error, by its SQLSTATE (see the module docstring):
    :class:`SinkUnavailable` (transient), :class:`RowsRejected` (the data) or plain
    :class:`SinkError` (configuration, or anything else). The message is ``doing`` then the
    SQLSTATE and the first line of the server's (or libpq's) words, with the column when the
    error names one; ``secret`` (the password) is blanked out should libpq ever quote it."""
    state = exc.sqlstate or ""
    words = first_line(exc)
    if secret:
        words = words.replace(secret, "***")
    column = _column_of(exc)
    detail = f"{state} {words}" if state else words
    if column is not None:
        detail += f" (column {column!r})"
    message = f"{doing}: {detail}" if doing else detail
    if state:
        transient = state in _TRANSIENT_STATES or (
            state[:2] in _TRANSIENT_CLASSES and state not in _LASTING_STATES
        )
    else:  # raised by the client: connection refused, lost, timed out
        transient = isinstance(exc, psycopg.OperationalError) and not _CONFIG_WORDS.search(str(exc))
    if transient:
        return SinkUnavailable(message)
    if state[:2] in _REJECTED_CLASSES or state in _REJECTED_STATES:
        return RowsRejected(message)
    return SinkError(message)


def _text_with_nul(columns: Sequence[_Column], rows: ResultRows) -> tuple[str, int] | None:
    """The first text column and row holding U+0000 (only called once the server refused)."""
    named: list[tuple[str, NDArray[Any], NDArray[np.bool_] | None]] = [
        ("chunk_id", rows.chunk_id, None),
        ("source_message_id", rows.source_message_id, None),
        *(
            (c.name, column_values(rows, c.spec), null_mask(rows, c.name))
            for c in columns
            if c.pg_type == "text"
        ),
    ]
    for name, values, mask in named:
        for i, value in enumerate(values.tolist()):
            if isinstance(value, str) and "\x00" in value and (mask is None or not mask[i]):
                return name, i
    for name, value in (("model_name", rows.model_name), ("model_version", rows.model_version)):
        if "\x00" in value:
            return name, 0
    return None


@dataclass(frozen=True)
class _Column:
    name: str
    pg_type: str  # as format_type() spells it, so it doubles as the check
    encode: Callable[[ResultRows, slice], Cells]
    spec: ColumnSpec

    @property
    def dim(self) -> int:
        return self.spec.dim

    @property
    def comment(self) -> str:
        """Arrays carry no length in their type: vector columns record theirs as a comment."""
        return f"{_VECTOR_COMMENT}{self.spec.dtype}[{self.spec.dim}]"


def _pg_type(col: ColumnSpec) -> str:
    if col.dtype in TEXT_DTYPES:
        return "text"
    if col.dtype == "bytes":
        return "bytea"
    base = _NUMERIC[col.dtype][0]
    return f"{base}[]" if col.dim else base


def _split(records: NDArray[Any], mask: NDArray[np.bool_] | None) -> list[bytes | memoryview]:
    buf = memoryview(records.view(np.uint8).reshape(-1).data)  # slices are views: no copies
    width = records.dtype.itemsize
    cells: list[bytes | memoryview] = [buf[i : i + width] for i in range(0, len(buf), width)]
    if mask is not None:
        for i in np.flatnonzero(mask).tolist():
            cells[i] = _NULL
    return cells


def _encoder(col: ColumnSpec) -> Callable[[ResultRows, slice], Cells]:
    def encode(rows: ResultRows, part: slice) -> Cells:
        values = column_values(rows, col)[part]
        mask = null_mask(rows, col.name)
        mask = None if mask is None else mask[part]
        if col.dtype in TEXT_DTYPES or col.dtype == "bytes":
            return _varlen_cells(col.name, values, mask, text=col.dtype != "bytes")
        _, fmt, oid = _NUMERIC[col.dtype]
        size = np.dtype(fmt).itemsize
        if col.dim == 0:
            records = np.empty(len(values), dtype=[("len", ">i4"), ("v", fmt)])
            records["len"] = size
            records["v"] = values
            return _split(records, mask)
        element = np.dtype([("len", ">i4"), ("v", fmt)])
        layout = np.dtype([("len", ">i4"), ("head", ">i4", (5,)), ("e", element, (col.dim,))])
        records = np.empty(len(values), dtype=layout)
        records["len"] = layout.itemsize - 4
        records["head"] = (1, 0, oid, col.dim, 1)  # ndim, has-nulls, element oid, size, lbound
        records["e"]["len"] = size
        records["e"]["v"] = values
        return _split(records, mask)

    return encode


def _varlen_cells(
    name: str, values: NDArray[Any], mask: NDArray[np.bool_] | None, *, text: bool
) -> list[bytes]:
    items = values.tolist()
    if mask is None and text and set(map(type, items)) <= {str}:
        # Keys repeat (one chunk id per message): encode each distinct value once.
        distinct = {value: _text(value) for value in set(items)}
        return list(map(distinct.__getitem__, items))
    pack = struct.Struct(">i").pack
    want = str if text else bytes
    cells: list[bytes] = []
    nulls = mask.tolist() if mask is not None else repeat(False, len(values))
    for i, (value, null) in enumerate(zip(values.tolist(), nulls, strict=False)):
        if null:
            cells.append(_NULL)
            continue
        if not isinstance(value, want):
            raise SinkError(
                f"column {name!r} row {i}: expected {want.__name__}, found {type(value).__name__}"
            )
        data = value.encode() if isinstance(value, str) else value
        cells.append(pack(len(data)) + data)
    return cells


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def _key_cells(rows: ResultRows, part: slice) -> list[Cells]:
    index = np.empty(len(rows.row_index[part]), dtype=[("len", ">i4"), ("v", ">i8")])
    index["len"] = 8
    index["v"] = rows.row_index[part]
    return [
        _varlen_cells("chunk_id", rows.chunk_id[part], None, text=True),
        _split(index, None),
        _varlen_cells("source_message_id", rows.source_message_id[part], None, text=True),
    ]


def _encode(columns: Sequence[_Column], rows: ResultRows, part: slice) -> bytes:
    """The binary COPY tuples of ``rows[part]`` (without the signature and trailer)."""
    n = len(rows.row_index[part])
    micros = (utc(rows.processed_at) - _PG_EPOCH) // timedelta(microseconds=1)
    tail = _text(rows.model_name) + _text(rows.model_version) + struct.pack(">iq", 8, micros)
    fields: list[Any] = [
        repeat(struct.pack(">h", len(columns) + 6), n),
        *_key_cells(rows, part),
        *(c.encode(rows, part) for c in columns),
        repeat(tail, n),
    ]
    return b"".join(chain.from_iterable(zip(*fields, strict=False)))


def _password(dsn: str) -> str:
    with contextlib.suppress(psycopg.ProgrammingError):
        return str(conninfo_to_dict(dsn).get("password") or "")
    return ""


def _describe(dsn: str) -> str:
    """``host:port/dbname`` for messages (never the password)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    host = info.get("host") or info.get("hostaddr") or "localhost"
    return f"{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


class PostgresSink:
    """Result rows in ``schema.<TableSpec.name>`` of the PostgreSQL database at ``dsn``."""

    def __init__(self, dsn: str, *, schema: str = "public") -> None:
        self._dsn = dsn
        self._schema = schema
        self._where = _describe(dsn)
        self._secret = _password(dsn)
        self._conn: _Conn | None = None
        self._table: TableSpec | None = None
        self._columns: tuple[_Column, ...] = ()
        self._copy_sql = self._insert_sql = self._delete_sql = sql.Composed([])
        self._lock = asyncio.Lock()

    # --- Sink ----------------------------------------------------------------------------------

    async def open(self, table: TableSpec) -> None:
        columns = tuple(_Column(c.name, _pg_type(c), _encoder(c), c) for c in table_columns(table))
        async with self._lock:
            if self._table is not None:
                raise SinkError("PostgresSink is already open")
            self._table = table
            self._columns = columns
            self._copy_sql, self._insert_sql, self._delete_sql = self._statements()
            try:
                conn = await self._connect()
                try:
                    await self._ensure_table(conn)
                    await self._create_staging(conn)
                except psycopg.Error as exc:
                    fault = self._classify(exc, f"PostgreSQL sink open of {self._label()}")
                    if isinstance(fault, RowsRejected):  # no rows yet: a plain error
                        fault = SinkError(str(fault))
                    raise fault from exc
            except BaseException:
                self._table = None
                await self._drop_connection()
                raise

    async def write(self, rows: ResultRows) -> None:
        self._require()
        n = len(rows)
        if n == 0:
            return
        check_keys(rows)
        for col in self._columns:
            column_values(rows, col.spec)  # shapes, before anything is sent
        parts = [slice(lo, min(lo + _SLICE_ROWS, n)) for lo in range(0, n, _SLICE_ROWS)]
        copy_sql, insert_sql = self._copy_sql, self._insert_sql

        async def copy_and_insert(conn: _Conn) -> None:
            async with conn.transaction(), conn.cursor() as cur:
                async with cur.copy(copy_sql) as copy:
                    await copy.write(_SIGNATURE)
                    for part in parts:  # the server parses one slice while the next is encoded
                        await copy.write(
                            await asyncio.to_thread(_encode, self._columns, rows, part)
                        )
                    await copy.write(_TRAILER)
                await cur.execute(insert_sql)

        try:
            await self._run("write", copy_and_insert)
        except RowsRejected as exc:
            cause = exc.__cause__
            if not isinstance(cause, psycopg.Error) or cause.sqlstate not in _ENCODING_STATES:
                raise
            found = _text_with_nul(self._columns, rows)
            if found is None:
                raise
            name, i = found
            raise RowsRejected(
                f"PostgreSQL sink write on {self._where}: column {name!r} of row {i}"
                f" (chunk {str(rows.chunk_id[i])!r}) contains U+0000 (NUL), which PostgreSQL"
                f" cannot store in text; the server said: {self._classify(cause, '')}",
                code="text_contains_nul",
            ) from cause

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self._require()
        if not chunk_ids:
            return
        delete_sql = self._delete_sql

        async def delete(conn: _Conn) -> None:
            await conn.execute(delete_sql, (list(chunk_ids),))

        await self._run("delete_chunks", delete)

    async def close(self) -> None:
        async with self._lock:
            await self._drop_connection()
            self._table = None

    # --- connection handling -------------------------------------------------------------------

    def _require(self) -> TableSpec:
        if self._table is None:
            raise SinkError("PostgresSink is not open")
        return self._table

    def _classify(self, exc: psycopg.Error, doing: str) -> SinkError:
        return classify_pg_error(exc, doing, secret=self._secret)

    async def _connect(self) -> _Conn:
        try:
            self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        except psycopg.Error as exc:
            fault = self._classify(exc, f"cannot connect to PostgreSQL at {self._where}")
            if isinstance(fault, RowsRejected):
                fault = SinkError(str(fault))
            raise fault from exc
        return self._conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, OSError):  # it may be half-dead already
                await conn.close()

    async def _run(self, what: str, op: Callable[[_Conn], Awaitable[_T]]) -> _T:
        """``op`` on the connection; once more on a fresh connection if it dropped. A psycopg
        error is raised classified (:func:`classify_pg_error`); after a transient one, or when
        the connection is not clean and idle, the connection is dropped so the next call
        starts afresh."""
        async with self._lock:
            self._require()
            if self._conn is None or self._conn.closed or self._conn.broken:
                await self._reconnect(what, None)
            try:
                return await self._attempt(what, op, retry=True)
            except psycopg.Error as exc:
                conn = self._conn
                fault = self._classify(exc, f"PostgreSQL sink {what} on {self._where}")
                if conn is None or conn.closed or conn.broken:
                    if not isinstance(fault, SinkUnavailable):
                        fault = SinkUnavailable(str(fault))  # the connection died under it
                elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    await self._drop_connection()  # never reuse a half-done transaction
                if isinstance(fault, SinkUnavailable):
                    await self._drop_connection()
                raise fault from exc

    async def _attempt(self, what: str, op: Callable[[_Conn], Awaitable[_T]], *, retry: bool) -> _T:
        conn = self._conn
        assert conn is not None
        try:
            return await op(conn)
        except psycopg.OperationalError as exc:
            if not (conn.closed or conn.broken):
                raise  # the connection is fine: an error of the statement itself
            if not retry:
                await self._drop_connection()
                raise SinkUnavailable(
                    f"PostgreSQL sink {what} on {self._where} failed after reconnecting: "
                    f"{self._classify(exc, '')}"
                ) from exc
            log.warning(
                "PostgreSQL sink %s on %s: connection dropped (%s); reconnecting once",
                what,
                self._where,
                exc,
            )
            await self._reconnect(what, exc)
            return await self._attempt(what, op, retry=False)
        except asyncio.CancelledError:
            await self._drop_connection()  # mid-protocol: the server rolls the transaction back
            raise

    async def _reconnect(self, what: str, cause: psycopg.Error | None) -> None:
        await self._drop_connection()
        try:
            conn = await self._connect()
            await self._create_staging(conn)
        except (SinkError, psycopg.Error) as exc:
            await self._drop_connection()
            fault = exc if isinstance(exc, SinkError) else self._classify(exc, "")
            lost = f"the connection dropped ({self._classify(cause, '')}) and " if cause else ""
            message = f"PostgreSQL sink {what} on {self._where}: {lost}reconnecting failed: {fault}"
            if isinstance(fault, SinkUnavailable):
                raise SinkUnavailable(message) from exc
            raise SinkError(message) from exc

    # --- schema --------------------------------------------------------------------------------

    def _target(self) -> sql.Identifier:
        return sql.Identifier(self._schema, self._require().name)

    def _all_columns(self) -> list[tuple[str, str]]:
        return [
            ("chunk_id", "text"),
            ("row_index", "bigint"),
            ("source_message_id", "text"),
            *((c.name, c.pg_type) for c in self._columns),
            ("model_name", "text"),
            ("model_version", "text"),
            ("processed_at", "timestamp with time zone"),
        ]

    def _definitions(self) -> sql.Composed:
        return sql.SQL(", ").join(
            sql.SQL("{} {}").format(
                sql.Identifier(name),
                sql.SQL(pg_type + (" NOT NULL" if name in ("chunk_id", "row_index") else "")),
            )
            for name, pg_type in self._all_columns()
        )

    def _statements(self) -> tuple[sql.Composed, sql.Composed, sql.Composed]:
        """``COPY`` into staging, ``INSERT`` from staging, ``DELETE`` of chunks."""
        names = sql.SQL(", ").join(sql.Identifier(n) for n, _ in self._all_columns())
        staging = sql.Identifier(_STAGING)
        return (
            sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(staging, names),
            sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT (chunk_id, row_index) DO NOTHING"
            ).format(self._target(), names, names, staging),
            sql.SQL("DELETE FROM {} WHERE chunk_id = ANY(%s)").format(self._target()),
        )

    async def _create_staging(self, conn: _Conn) -> None:
        await conn.execute(
            sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                sql.Identifier(_STAGING), self._definitions()
            )
        )

    async def _ensure_table(self, conn: _Conn) -> None:
        name = self._require().name
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"rowbatch-sink:{self._schema}.{name}",),
            )
            found = await (
                await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self._schema,))
            ).fetchone()
            if found is None:
                await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self._schema)))
            relation = await (
                await conn.execute(
                    "SELECT c.oid, c.relkind FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relname = %s",
                    (self._schema, name),
                )
            ).fetchone()
            if relation is None:
                await conn.execute(
                    sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY (chunk_id, row_index))").format(
                        self._target(), self._definitions()
                    )
                )
                for col in self._columns:
                    if col.dim:
                        await conn.execute(
                            sql.SQL("COMMENT ON COLUMN {} IS {}").format(
                                sql.Identifier(self._schema, name, col.name),
                                sql.Literal(col.comment),
                            )
                        )
                return
            oid, kind = relation
            if kind not in ("r", "p"):
                raise TableMismatch(
                    f"{self._label()} exists but is not a table (relkind {kind!r})",
                    column="chunk_id",
                )
            await self._check(conn, oid)

    def _label(self) -> str:
        return f"{self._schema}.{self._require().name} on {self._where}"

    async def _check(self, conn: _Conn, oid: int) -> None:
        cur = await conn.execute(
            "SELECT attnum, attname, format_type(atttypid, atttypmod), attnotnull, atthasdef"
            " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            (oid,),
        )
        found = {row[1]: row for row in await cur.fetchall()}
        names = {row[0]: row[1] for row in found.values()}
        for column, pg_type in self._all_columns():
            row = found.pop(column, None)
            if row is None:
                raise TableMismatch(
                    f"existing table {self._label()} lacks column {column!r} ({pg_type})",
                    column=column,
                )
            if row[2] != pg_type:
                raise TableMismatch(
                    f"existing table {self._label()}: column {column!r} is {row[2]},"
                    f" expected {pg_type}",
                    column=column,
                )
        await self._check_dims(conn, oid)
        for _, column, _, not_null, has_default in found.values():
            if not_null and not has_default:
                raise TableMismatch(
                    f"existing table {self._label()} has an extra NOT NULL column {column!r}"
                    " without a default",
                    column=column,
                )
        cur = await conn.execute(
            "SELECT indkey::int2[] FROM pg_index WHERE indrelid = %s AND indisunique"
            " AND indpred IS NULL AND indexprs IS NULL",
            (oid,),
        )
        keys = [{names.get(k) for k in row[0]} for row in await cur.fetchall()]
        if {"chunk_id", "row_index"} not in keys:
            raise TableMismatch(
                f"existing table {self._label()} has no primary key or unique index on"
                " (chunk_id, row_index)",
                column="chunk_id",
            )

    async def _check_dims(self, conn: _Conn, oid: int) -> None:
        """Vector columns hold vectors of the spec's length: by the comment this sink leaves,
        or, on a table made elsewhere, by one stored row."""
        for col in self._columns:
            if not col.dim:
                continue
            cur = await conn.execute(
                "SELECT col_description(attrelid, attnum) FROM pg_attribute"
                " WHERE attrelid = %s AND attname = %s AND NOT attisdropped",
                (oid, col.name),
            )
            row = await cur.fetchone()
            if row is None:
                continue  # a missing column is reported with the type check
            comment = row[0] or ""
            if comment.startswith(_VECTOR_COMMENT):
                if comment != col.comment:
                    raise TableMismatch(
                        f"existing table {self._label()}: column {col.name!r} holds"
                        f" {comment.removeprefix(_VECTOR_COMMENT)} vectors,"
                        f" expected {col.spec.dtype}[{col.dim}]",
                        column=col.name,
                    )
                continue
            cur = await conn.execute(
                sql.SQL("SELECT cardinality({}) FROM {} WHERE {} IS NOT NULL LIMIT 1").format(
                    sql.Identifier(col.name), self._target(), sql.Identifier(col.name)
                )
            )
            sample = await cur.fetchone()
            if sample is not None and sample[0] != col.dim:
                raise TableMismatch(
                    f"existing table {self._label()}: column {col.name!r} holds vectors of"
                    f" {sample[0]} elements, expected {col.dim}",
                    column=col.name,
                )


__all__ = ["PostgresSink"]
