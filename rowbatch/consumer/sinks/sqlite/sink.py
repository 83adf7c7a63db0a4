"""The SQLite sink: one connection, used on one thread, each write one ``INSERT OR IGNORE``
transaction."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from rowbatch.consumer.sinks.base import (
    ResultRows,
    SinkError,
    TableSpec,
    finish_on_cancel,
    in_thread,
)
from rowbatch.consumer.sinks.sqlite.db import BUSY_TIMEOUT_S, sqlite_transaction
from rowbatch.consumer.sinks.sqlite.faults import classify_open_error, classify_sqlite_error
from rowbatch.consumer.sinks.sqlite.rows import records
from rowbatch.consumer.sinks.sqlite.table import layout, prepare, quote

_T = TypeVar("_T")


class SqliteSink:
    """Result rows in the table ``TableSpec.name`` of the SQLite database at ``path``."""

    def __init__(self, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
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
        loop = asyncio.get_running_loop()
        return await finish_on_cancel(loop.run_in_executor(self._db_thread, func, *args))

    async def open(self, table: TableSpec) -> None:
        columns = layout(table)
        names = ", ".join(quote(n) for n, _ in columns)
        marks = ", ".join("?" for _ in columns)
        async with self._lock:
            if self._conn is not None:
                raise SinkError("SqliteSink is already open")
            try:
                self._conn = await self._on_db_thread(self._connect, table, columns)
            except (sqlite3.Error, OSError) as exc:
                raise classify_open_error(exc, f"SQLite sink open of {self._path}") from exc
            self._table = table
            self._names = tuple(n for n, _ in columns)
            self._insert = f"INSERT OR IGNORE INTO {quote(table.name)} ({names}) VALUES ({marks})"  # noqa: S608
            self._delete = f"DELETE FROM {quote(table.name)} WHERE chunk_id = ?"  # noqa: S608

    def _connect(self, table: TableSpec, columns: list[tuple[str, str]]) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self._path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            prepare(conn, self._path, table, columns)
        except BaseException:
            conn.close()
            raise
        return conn

    async def write(self, rows: ResultRows) -> int:
        table = self._require()
        if len(rows) == 0:
            return 0
        params = await in_thread(records, table, rows)
        # INSERT OR IGNORE: rowcount counts the rows inserted, not the ones already there.
        return await self._run(
            "write", lambda conn: conn.executemany(self._insert, params).rowcount
        )

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
