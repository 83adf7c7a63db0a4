"""The PostgreSQL sink: one connection (retried once when it drops), each ``write`` one
transaction of binary ``COPY`` into staging then ``INSERT ... ON CONFLICT DO NOTHING``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql

from rowbatch.consumer.sinks.base import (
    ENCODE_SLICE_BYTES,
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    TableSpec,
    check_keys,
    column_values,
    demote_rejection,
)
from rowbatch.consumer.sinks.postgres.copy_binary import (
    SIGNATURE,
    TRAILER,
    encode_tuples,
    pg_columns,
)
from rowbatch.consumer.sinks.postgres.dsn import describe, password
from rowbatch.consumer.sinks.postgres.faults import classify_pg_error, nul_in_text
from rowbatch.consumer.sinks.postgres.table import PgTable, Statements

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_Conn = psycopg.AsyncConnection[Any]

_SLICE_ROWS: Final = 2_000  # most rows encoded per COPY write


def slice_rows(rows: ResultRows) -> int:
    """Rows per COPY slice: at most ``_SLICE_ROWS``, and about ``ENCODE_SLICE_BYTES`` of COPY
    data (a binary COPY field of a number takes 4 bytes of length beside its value, so a row's
    encoding is up to twice its values; 64 bytes for the key, ids and names)."""
    n = len(rows)
    arrays = (*rows.passthrough.values(), *rows.outputs.values())
    per_row = 64 + 2 * sum(a.nbytes for a in arrays) // max(n, 1)
    return max(1, min(_SLICE_ROWS, ENCODE_SLICE_BYTES // per_row))


class PostgresSink:
    """Result rows in ``schema.<TableSpec.name>`` of the PostgreSQL database at ``dsn``."""

    def __init__(self, dsn: str, *, schema: str = "public") -> None:
        self._dsn = dsn
        self._schema = schema
        self._where = describe(dsn)
        self._secret = password(dsn)
        self._conn: _Conn | None = None
        self._table: PgTable | None = None
        self._sql = Statements(sql.Composed([]), sql.Composed([]), sql.Composed([]))
        self._lock = asyncio.Lock()

    # --- Sink ----------------------------------------------------------------------------------

    async def open(self, table: TableSpec) -> None:
        pg_table = PgTable(self._schema, table.name, pg_columns(table), self._where)
        async with self._lock:
            if self._table is not None:
                raise SinkError("PostgresSink is already open")
            self._table = pg_table
            self._sql = pg_table.statements()
            try:
                conn = await self._connect()
                try:
                    await pg_table.ensure(conn)
                    await pg_table.create_staging(conn)
                except psycopg.Error as exc:
                    fault = self._classify(exc, f"PostgreSQL sink open of {pg_table.label}")
                    raise demote_rejection(fault) from exc  # no rows yet: a plain error
            except BaseException:
                self._table = None
                await self._drop_connection()
                raise

    async def write(self, rows: ResultRows) -> int:
        columns = self._require().columns
        n = len(rows)
        if n == 0:
            return 0
        check_keys(rows)
        for col in columns:
            column_values(rows, col.spec)  # shapes, before anything is sent
        step = slice_rows(rows)
        parts = [slice(lo, min(lo + step, n)) for lo in range(0, n, step)]
        statements = self._sql

        async def copy_and_insert(conn: _Conn) -> int:
            async with conn.transaction(), conn.cursor() as cur:
                async with cur.copy(statements.copy) as copy:
                    await copy.write(SIGNATURE)
                    for part in parts:  # the server parses one slice while the next is encoded
                        await copy.write(
                            await asyncio.to_thread(encode_tuples, columns, rows, part)
                        )
                    await copy.write(TRAILER)
                await cur.execute(statements.insert)  # ON CONFLICT DO NOTHING
                return max(0, cur.rowcount)

        try:
            return await self._run("write", copy_and_insert)
        except RowsRejected as exc:
            sharper = nul_in_text(exc, columns, rows, where=self._where, secret=self._secret)
            if sharper is None:
                raise
            raise sharper from exc.__cause__

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self._require()
        if not chunk_ids:
            return
        delete_sql = self._sql.delete

        async def delete(conn: _Conn) -> None:
            await conn.execute(delete_sql, (list(chunk_ids),))

        await self._run("delete_chunks", delete)

    async def close(self) -> None:
        async with self._lock:
            await self._drop_connection()
            self._table = None

    # --- connection handling -------------------------------------------------------------------

    def _require(self) -> PgTable:
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
            raise demote_rejection(fault) from exc
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
            await self._require().create_staging(conn)
        except (SinkError, psycopg.Error) as exc:
            await self._drop_connection()
            fault = exc if isinstance(exc, SinkError) else self._classify(exc, "")
            lost = f"the connection dropped ({self._classify(cause, '')}) and " if cause else ""
            message = f"PostgreSQL sink {what} on {self._where}: {lost}reconnecting failed: {fault}"
            if isinstance(fault, SinkUnavailable):
                raise SinkUnavailable(message) from exc
            raise SinkError(message) from exc
