"""What the sinks' SQLite files share (the SQLite sink's database, the Parquet sink's key
index): the busy timeout and the transaction wrapper."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final, TypeVar

_T = TypeVar("_T")

#: How long a statement waits for another connection's lock before "database is locked".
BUSY_TIMEOUT_S: Final = 30.0


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
