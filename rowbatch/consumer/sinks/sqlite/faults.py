"""The SQLite sink's faults, told apart by SQLite's result code.

"database is locked" / busy past the busy timeout, a full disk (``SQLITE_FULL``) and I/O errors
raise :class:`~rowbatch.consumer.sinks.base.SinkUnavailable` (the pipeline retries the same write;
the failed transaction was rolled back, so the sink is usable as it is); a value SQLite refuses (a
constraint, a value too big, one it cannot bind) raises
:class:`~rowbatch.consumer.sinks.base.RowsRejected`; anything else plain
:class:`~rowbatch.consumer.sinks.base.SinkError`.
"""

from __future__ import annotations

import errno
import re
import sqlite3
from collections.abc import Sequence
from typing import Final

from rowbatch.consumer.sinks.base import (
    RowsRejected,
    SinkError,
    SinkUnavailable,
    demote_rejection,
    first_line,
)

#: Primary result codes (the low byte of ``sqlite_errorcode``) of faults that pass.
_TRANSIENT_CODES: Final = frozenset(
    {
        5,  # SQLITE_BUSY: "database is locked" past the busy timeout
        6,  # SQLITE_LOCKED
        10,  # SQLITE_IOERR (a full disk often shows as IOERR_WRITE)
        13,  # SQLITE_FULL: "database or disk is full"
    }
)
_TRANSIENT_WORDS: Final = re.compile(
    r"database is locked|database table is locked|disk is full", re.I
)
_BINDING: Final = re.compile(r"Error binding parameter :?(\d+)")


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


def classify_open_error(exc: sqlite3.Error | OSError, doing: str) -> SinkError:
    """The sink error for a failure to open the database and prepare its table: as
    :func:`classify_sqlite_error` (but no rows are at fault), a full disk passes, any other
    OS error is plain :class:`SinkError`."""
    if isinstance(exc, sqlite3.Error):
        return demote_rejection(classify_sqlite_error(exc, doing))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SinkUnavailable(f"{doing}: {first_line(exc)}")
    return SinkError(f"{doing}: {first_line(exc)}")
