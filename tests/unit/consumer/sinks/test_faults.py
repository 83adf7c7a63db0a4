"""Each sink's fault classification, with constructed exceptions: transient faults are
SinkUnavailable, refused values RowsRejected, configuration problems plain SinkError."""

from __future__ import annotations

import errno
import sqlite3

import psycopg
import pyarrow as pa
import pytest
from psycopg import errors

from rowbatch.consumer.service.build_io import _column_spec
from rowbatch.consumer.sinks.base import (
    ColumnSpec,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    first_line,
)
from rowbatch.consumer.sinks.parquet.faults import classify_parquet_error
from rowbatch.consumer.sinks.postgres.faults import classify_pg_error
from rowbatch.consumer.sinks.sqlite.faults import classify_sqlite_error
from rowbatch.wire.columns.column_type import ColumnType


def _kind(fault: SinkError) -> type[SinkError]:
    return type(fault)


# --- PostgreSQL --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("40001", SinkUnavailable),  # serialization_failure
        ("40P01", SinkUnavailable),  # deadlock_detected
        ("57P01", SinkUnavailable),  # admin_shutdown
        ("57P03", SinkUnavailable),  # cannot_connect_now
        ("08006", SinkUnavailable),  # connection_failure
        ("53300", SinkUnavailable),  # too_many_connections
        ("53100", SinkUnavailable),  # disk_full
        ("25006", SinkUnavailable),  # read_only_sql_transaction: a standby after failover
        ("22021", RowsRejected),  # character_not_in_repertoire
        ("22P05", RowsRejected),  # untranslatable_character
        ("22003", RowsRejected),  # numeric_value_out_of_range
        ("23502", RowsRejected),  # not_null_violation
        ("23514", RowsRejected),  # check_violation
        ("42P01", SinkError),  # undefined_table
        ("42703", SinkError),  # undefined_column
        ("42501", SinkError),  # insufficient_privilege
        ("28P01", SinkError),  # invalid_password
        ("3D000", SinkError),  # invalid_catalog_name
        ("57P04", SinkError),  # database_dropped
        ("XX000", SinkError),  # internal_error
    ],
)
def test_pg_sqlstates(state: str, expected: type[SinkError]) -> None:
    exc = errors.lookup(state)(f"the server's words for {state}\nDETAIL: more")
    assert exc.sqlstate == state
    fault = classify_pg_error(exc, "PostgreSQL sink write on h:5432/db")
    assert _kind(fault) is expected
    assert (
        str(fault) == f"PostgreSQL sink write on h:5432/db: {state} the server's words for {state}"
    )


def test_pg_rejected_code_is_the_default() -> None:
    fault = classify_pg_error(errors.lookup("22003")("numeric field overflow"))
    assert isinstance(fault, RowsRejected)
    assert fault.code == "sink_rejected_value"


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (
            'connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused\n\tIs the server running on that host?",
            SinkUnavailable,
        ),
        ("connection failed: FATAL:  the database system is starting up", SinkUnavailable),
        ("connection failed: FATAL:  sorry, too many clients already", SinkUnavailable),
        ("consuming input failed: server closed the connection unexpectedly", SinkUnavailable),
        ("connection timeout expired", SinkUnavailable),
        (
            'connection failed: FATAL:  password authentication failed for user "rowbatch"',
            SinkError,
        ),
        ('connection failed: FATAL:  database "nowhere" does not exist', SinkError),
        ('connection failed: FATAL:  role "nobody" does not exist', SinkError),
        ("connection failed: FATAL:  no pg_hba.conf entry for host", SinkError),
    ],
)
def test_pg_errors_without_sqlstate(words: str, expected: type[SinkError]) -> None:
    fault = classify_pg_error(psycopg.OperationalError(words), "cannot connect")
    assert _kind(fault) is expected
    assert str(fault) == f"cannot connect: {words.splitlines()[0]}"


def test_pg_an_interface_error_is_not_transient() -> None:
    assert _kind(classify_pg_error(psycopg.InterfaceError("the connection is closed"))) is SinkError


def test_pg_the_password_is_never_quoted() -> None:
    exc = psycopg.OperationalError("connection failed: something about s3cret-pw here")
    fault = classify_pg_error(exc, "cannot connect", secret="s3cret-pw")
    assert "s3cret-pw" not in str(fault)
    assert "***" in str(fault)


# --- SQLite ------------------------------------------------------------------------------------


def _sqlite(cls: type[sqlite3.Error], words: str, code: int | None) -> sqlite3.Error:
    exc = cls(words)
    if code is not None:
        exc.sqlite_errorcode = code
    return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_sqlite(sqlite3.OperationalError, "database is locked", 5), SinkUnavailable),
        (_sqlite(sqlite3.OperationalError, "database is locked", None), SinkUnavailable),
        (_sqlite(sqlite3.OperationalError, "database table is locked", 6), SinkUnavailable),
        (_sqlite(sqlite3.OperationalError, "database or disk is full", 13), SinkUnavailable),
        (_sqlite(sqlite3.OperationalError, "disk I/O error", 10 | (3 << 8)), SinkUnavailable),
        (_sqlite(sqlite3.IntegrityError, "NOT NULL constraint failed: t.x", 1299), RowsRejected),
        (_sqlite(sqlite3.DataError, "string or blob too big", 18), RowsRejected),
        (_sqlite(sqlite3.OperationalError, "no such table: results", 1), SinkError),
        (_sqlite(sqlite3.OperationalError, "attempt to write a readonly database", 8), SinkError),
    ],
)
def test_sqlite_errors(exc: sqlite3.Error, expected: type[SinkError]) -> None:
    fault = classify_sqlite_error(exc, "SQLite sink write on db.sqlite")
    assert _kind(fault) is expected
    assert str(fault) == f"SQLite sink write on db.sqlite: {exc}"


def test_sqlite_an_unbindable_value_names_its_column() -> None:
    exc = sqlite3.ProgrammingError("Error binding parameter 2: type 'dict' is not supported")
    fault = classify_sqlite_error(exc, columns=("chunk_id", "row_index", "x"))
    assert isinstance(fault, RowsRejected)
    assert "(column 'row_index')" in str(fault)
    overflow = OverflowError("Python int too large to convert to SQLite INTEGER")
    assert isinstance(classify_sqlite_error(overflow), RowsRejected)


# --- Parquet -----------------------------------------------------------------------------------


class _ClientError(Exception):
    """Stands in for botocore's ClientError (a ``response`` dict)."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code}) when calling the PutObject operation")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _caused(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), SinkUnavailable),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), SinkUnavailable),
        (
            OSError("When uploading part for key 'x': AWS Error SLOW_DOWN during UploadPart"),
            SinkUnavailable,
        ),
        (OSError("AWS Error NETWORK_CONNECTION during PutObject operation"), SinkUnavailable),
        (OSError("curlCode: 28, Timeout was reached"), SinkUnavailable),
        (OSError("google::cloud::Status(UNAVAILABLE: HTTP response code 503)"), SinkUnavailable),
        (
            OSError("Generic S3 error: HTTP status server error (503 Service Unavailable)"),
            SinkUnavailable,
        ),
        (OSError("Too Many Requests"), SinkUnavailable),
        (TimeoutError("read timed out"), SinkUnavailable),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), SinkUnavailable),
        (_ClientError(503, "SlowDown"), SinkUnavailable),
        (_ClientError(500, "InternalError"), SinkUnavailable),
        (_HttpError(429), SinkUnavailable),
        (_caused(OSError("upload failed"), _HttpError(502)), SinkUnavailable),
        (_sqlite(sqlite3.OperationalError, "database is locked", 5), SinkUnavailable),
        (_ClientError(403, "AccessDenied"), SinkError),
        (_HttpError(404), SinkError),
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), SinkError),
        (PermissionError(errno.EACCES, "Permission denied"), SinkError),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation"), SinkError),
        (pa.ArrowInvalid("Parquet magic bytes not found in footer"), SinkError),
    ],
)
def test_parquet_errors(exc: BaseException, expected: type[SinkError]) -> None:
    fault = classify_parquet_error(exc, "Parquet sink write on s3://bucket/results")
    assert _kind(fault) is expected
    assert str(fault) == f"Parquet sink write on s3://bucket/results: {first_line(exc)}"


# --- the result column of a passthrough column -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("string", ColumnSpec("c", "object")),
        ("bytes", ColumnSpec("c", "bytes")),
        ("int64", ColumnSpec("c", "int64")),
        ("float32", ColumnSpec("c", "float32")),
        ("bool", ColumnSpec("c", "bool")),
        ("vector[float32,8]", ColumnSpec("c", "float32", 8)),
    ],
)
def test_passthrough_column_specs(text: str, spec: ColumnSpec) -> None:
    assert _column_spec("c", ColumnType.parse(text)) == spec


def test_first_line() -> None:
    assert first_line(ValueError("\n  one\ntwo")) == "one"
    assert first_line(ValueError()) == "ValueError"
