"""The PostgreSQL sink's faults, told apart by SQLSTATE (:func:`classify_pg_error`).

* :class:`~rowbatch.consumer.sinks.base.SinkUnavailable` (the pipeline retries the same write
later):
  the connection is lost or cannot be made (no SQLSTATE, class ``08``; connection refused,
  server starting up or shutting down ``57P01``-``57P03``), serialization failure ``40001``,
  deadlock ``40P01``, too many connections / out of resources (class ``53``), a read-only
  server after a failover ``25006``, a lock timeout ``55P03``. The broken or suspect connection
  is dropped, so the next call reconnects (a new staging table; nothing half-done survives,
  the failed transaction was rolled back).
* :class:`~rowbatch.consumer.sinks.base.RowsRejected` (the pipeline bisects and dead-letters): data
  exceptions (class ``22``) and integrity violations (class ``23``), with the database's first
  line of message and the column when it names one. Text containing U+0000, which PostgreSQL
  cannot store in ``text``, is named as such (code ``text_contains_nul``, :func:`nul_in_text`);
  the check runs only once the server refused the write (``22021``/``22P05``), so the happy
  path pays nothing.
* :class:`~rowbatch.consumer.sinks.base.SinkError` otherwise: configuration problems (class ``42``
  undefined table/column or ``42501`` insufficient privilege, class ``28`` authentication,
  ``3D000`` no such database).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import psycopg
from numpy.typing import NDArray

from rowbatch.consumer.sinks.base import (
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    column_values,
    first_line,
    null_mask,
)
from rowbatch.consumer.sinks.postgres.copy_binary import PgColumn

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


def nul_in_text(
    fault: RowsRejected, columns: Sequence[PgColumn], rows: ResultRows, *, where: str, secret: str
) -> RowsRejected | None:
    """For a write the server refused over encoding, the fault naming the text value that
    holds U+0000 (code ``text_contains_nul``); ``None`` when that is not the cause."""
    cause = fault.__cause__
    if not isinstance(cause, psycopg.Error) or cause.sqlstate not in _ENCODING_STATES:
        return None
    found = _text_with_nul(columns, rows)
    if found is None:
        return None
    name, i = found
    return RowsRejected(
        f"PostgreSQL sink write on {where}: column {name!r} of row {i}"
        f" (chunk {str(rows.chunk_id[i])!r}) contains U+0000 (NUL), which PostgreSQL"
        f" cannot store in text; the server said: {classify_pg_error(cause, secret=secret)}",
        code="text_contains_nul",
    )


def _text_with_nul(columns: Sequence[PgColumn], rows: ResultRows) -> tuple[str, int] | None:
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
