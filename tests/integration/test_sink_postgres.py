"""PostgresSink against a real PostgreSQL: the documented schema, checks of an existing table,
dtypes, quoting, concurrent writers, and reconnecting after a dropped connection."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from harness.faults import RestartablePostgres
from harness.postgres import PostgresEndpoint
from harness.service import RunDir
from rowbatch.consumer.sinks.base import (
    ColumnSpec,
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    TableMismatch,
    TableSpec,
)
from rowbatch.consumer.sinks.postgres.sink import PostgresSink
from tests.sink_data import check_snapshot, make_rows, spec

AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def _query(dsn: str, query: str | sql.Composed, params: tuple[Any, ...] = ()) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description is not None else []


def _count(dsn: str, schema: str, name: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))
    return int(_query(dsn, query)[0][0])


def _columns(dsn: str, schema: str, name: str) -> dict[str, str]:
    rows = _query(
        dsn,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (sql.Identifier(schema, name).as_string(),),
    )
    return dict(rows)


def _snapshot(dsn: str, name: str) -> dict[str, Any]:
    query = sql.SQL(
        "SELECT chunk_id, row_index, source_message_id, doc_id, title, embedding, score,"
        " model_name, model_version, processed_at FROM {}"
    ).format(sql.Identifier(name))
    rows = _query(dsn, query)
    names = [
        "chunk_id",
        "row_index",
        "source_message_id",
        "doc_id",
        "title",
        "embedding",
        "score",
        "model_name",
        "model_version",
        "processed_at",
    ]
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    snap: dict[str, Any] = {n: list(c) for n, c in zip(names, cols, strict=True)}
    snap["embedding"] = np.array(snap["embedding"], dtype=np.float32).reshape(len(rows), -1)
    return snap


async def test_creates_the_documented_schema(postgres: PostgresEndpoint) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    await sink.close()
    assert _columns(postgres.dsn, "public", name) == {
        "chunk_id": "text",
        "row_index": "bigint",
        "source_message_id": "text",
        "doc_id": "bigint",
        "title": "text",
        "embedding": "real[]",
        "score": "real",
        "model_name": "text",
        "model_version": "text",
        "processed_at": "timestamp with time zone",
    }
    key = _query(
        postgres.dsn,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
        (name,),
    )
    assert sorted(r[0] for r in key) == ["chunk_id", "row_index"]
    comment = _query(postgres.dsn, "SELECT col_description(%s::regclass, 6)", (name,))
    assert comment == [("rowbatch vector: float32[384]",)]


async def test_every_dtype_round_trips(postgres: PostgresEndpoint) -> None:
    name = _name()
    table = TableSpec(
        name,
        passthrough=(
            ColumnSpec("flag", "bool"),
            ColumnSpec("small", "int8"),
            ColumnSpec("unsigned", "uint32"),
            ColumnSpec("blob", "bytes"),
            ColumnSpec("label", "str"),
        ),
        outputs=(
            ColumnSpec("half", "float16"),
            ColumnSpec("double", "float64"),
            ColumnSpec("votes", "bool", 2),
            ColumnSpec("counts", "int32", 3),
            ColumnSpec("wide", "float64", 2),
        ),
    )
    rows = ResultRows(
        chunk_id=np.array(["c", "c", "d"], dtype=object),
        row_index=np.array([0, 1, 0], dtype=np.int64),
        source_message_id=np.array(["m1", "m1", "m2"], dtype=object),
        passthrough={
            "flag": np.array([True, False, True]),
            "small": np.array([-128, 127, 0], dtype=np.int8),
            "unsigned": np.array([0, 4_294_967_295, 7], dtype=np.uint32),
            "blob": np.array([b"\x00\xff", b"", None], dtype=object),
            "label": np.array(["ascii", "ünï ✓ 🎉", "x"], dtype=object),
        },
        outputs={
            "half": np.array([0.5, -2.0, 65504.0], dtype=np.float16),
            "double": np.array([1e300, np.nan, -np.inf]),
            "votes": np.array([[True, False], [False, False], [True, True]]),
            "counts": np.array([[1, 2, 3], [-1, 0, 2**31 - 1], [0, 0, 0]], dtype=np.int32),
            "wide": np.array([[1e-300, 2.5], [0.0, -0.0], [3.0, 4.0]]),
        },
        nulls={"blob": np.array([False, False, True]), "small": np.array([False, False, True])},
        model_name="m",
        model_version="v",
        processed_at=AT,
    )
    sink = PostgresSink(postgres.dsn)
    await sink.open(table)
    await sink.write(rows)
    await sink.close()
    assert _columns(postgres.dsn, "public", name)["votes"] == "boolean[]"
    assert _columns(postgres.dsn, "public", name)["wide"] == "double precision[]"
    got = _query(
        postgres.dsn,
        sql.SQL(
            "SELECT flag, small, unsigned, blob, label, half, double, votes, counts, wide,"
            " processed_at FROM {} ORDER BY chunk_id, row_index"
        ).format(sql.Identifier(name)),
    )
    assert got[0][:5] == (True, -128, 0, b"\x00\xff", "ascii")
    assert got[1][:5] == (False, 127, 4_294_967_295, b"", "ünï ✓ 🎉")
    assert got[2][1] is None
    assert got[2][3] is None
    assert [r[5] for r in got] == [0.5, -2.0, 65504.0]
    assert got[0][6] == 1e300
    assert np.isnan(got[1][6])
    assert got[2][6] == -np.inf
    assert [r[7] for r in got] == [[True, False], [False, False], [True, True]]
    assert [r[8] for r in got] == [[1, 2, 3], [-1, 0, 2**31 - 1], [0, 0, 0]]
    assert [r[9] for r in got] == [[1e-300, 2.5], [0.0, -0.0], [3.0, 4.0]]
    assert {r[10] for r in got} == {AT}


async def test_odd_identifiers_and_another_schema(postgres: PostgresEndpoint) -> None:
    schema = f'My "Schema" {uuid.uuid4().hex[:6]}'
    name = f'Results; DROP TABLE x; "{uuid.uuid4().hex[:6]}"'
    sink = PostgresSink(postgres.dsn, schema=schema)
    await sink.open(spec(name))
    await sink.write(make_rows(np.arange(50)))
    await sink.write(make_rows(np.arange(25, 75)))
    await sink.delete_chunks(["chunk-000'; DROP TABLE y; --"])
    await sink.close()
    assert _count(postgres.dsn, schema, name) == 75


async def test_an_existing_compatible_table_with_extra_columns_is_used(
    postgres: PostgresEndpoint,
) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    await sink.close()
    _query(
        postgres.dsn,
        sql.SQL("ALTER TABLE {} ADD COLUMN note text, ADD COLUMN n int NOT NULL DEFAULT 1").format(
            sql.Identifier(name)
        ),
    )
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    await sink.write(make_rows(np.arange(20)))
    await sink.close()
    assert _count(postgres.dsn, "public", name) == 20


@pytest.mark.parametrize(
    ("ddl", "column", "words"),
    [
        ("embedding real[], score float8", "score", "is double precision, expected real"),
        ("score real, embedding double precision[]", "embedding", "expected real[]"),
        ("score real, embedding real[]", "embedding", "384"),
        ("embedding real[]", "score", "lacks column 'score'"),
        ("score real, embedding real[], extra int NOT NULL", "extra", "extra NOT NULL"),
    ],
)
async def test_an_incompatible_existing_table_is_named(
    postgres: PostgresEndpoint, ddl: str, column: str, words: str
) -> None:
    name = _name()
    base = (
        "chunk_id text, row_index bigint, source_message_id text, doc_id bigint, title text,"
        " model_name text, model_version text, processed_at timestamptz, "
    )
    create = sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY (chunk_id, row_index))").format(
        sql.Identifier(name), sql.SQL(base + ddl)
    )
    _query(postgres.dsn, create)
    if words == "384":  # a table made elsewhere: the dim is read off a stored row
        _query(
            postgres.dsn,
            sql.SQL("INSERT INTO {} (chunk_id, row_index, embedding) VALUES ('c', 0, '{{1,2}}')")
            .format(sql.Identifier(name)),
        )  # fmt: skip
    sink = PostgresSink(postgres.dsn)
    with pytest.raises(TableMismatch, match=re.escape(words)) as caught:
        await sink.open(spec(name))
    assert caught.value.column == column
    assert repr(column) in str(caught.value)
    await sink.close()


async def test_a_table_without_the_key_is_refused(postgres: PostgresEndpoint) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    await sink.close()
    _query(
        postgres.dsn, sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
            sql.Identifier(name), sql.Identifier(f"{name}_pkey")
        )
    )  # fmt: skip
    with pytest.raises(TableMismatch, match=r"no primary key or unique index"):
        await PostgresSink(postgres.dsn).open(spec(name))


async def test_concurrent_sinks_never_duplicate(postgres: PostgresEndpoint) -> None:
    name = _name()
    sinks = [PostgresSink(postgres.dsn) for _ in range(4)]
    await asyncio.gather(*(s.open(spec(name)) for s in sinks))  # racing creators
    batches = [make_rows(np.arange(i * 300, i * 300 + 1_000)) for i in range(4)]
    await asyncio.gather(*(s.write(b) for s in sinks for b in batches))
    await asyncio.gather(*(s.close() for s in sinks))
    check_snapshot(_snapshot(postgres.dsn, name), range(1_900))


async def test_reconnects_once_after_the_connection_drops(
    postgres: PostgresEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    await sink.write(make_rows(np.arange(0, 100)))
    _kill_backends(postgres.dsn)
    await sink.write(make_rows(np.arange(50, 200)))  # retried on a fresh connection
    _kill_backends(postgres.dsn)
    await sink.delete_chunks(["chunk-000"])
    _kill_backends(postgres.dsn)
    await sink.write(make_rows(np.arange(0, 10)))
    await sink.close()
    check_snapshot(_snapshot(postgres.dsn, name), range(10))
    dropped = [r.getMessage() for r in caplog.records if "connection dropped" in r.getMessage()]
    assert len(dropped) == 3
    assert "write" in dropped[0]
    assert "delete_chunks" in dropped[1]


async def test_gives_up_with_a_clear_error_when_reconnecting_fails(
    postgres: PostgresEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    real_connect = psycopg.AsyncConnection.connect

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("connection refused (test)")

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)
    _kill_backends(postgres.dsn)
    with pytest.raises(
        SinkUnavailable, match=r"write on 127\.0\.0\.1:\d+/\w+: the connection dropped"
    ):
        await sink.write(make_rows(np.arange(10)))
    with pytest.raises(SinkUnavailable, match=r"reconnecting failed: .*connection refused"):
        await sink.write(make_rows(np.arange(10)))
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", real_connect)
    await sink.write(make_rows(np.arange(10)))  # the next call reconnects
    await sink.close()
    check_snapshot(_snapshot(postgres.dsn, name), range(10))


async def test_text_with_nul_is_rejected_naming_the_column(postgres: PostgresEndpoint) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    rows = make_rows(np.arange(3))
    rows.passthrough["title"][2] = "NUL \x00 is not valid in text"
    with pytest.raises(RowsRejected) as caught:
        await sink.write(rows)
    assert caught.value.code == "text_contains_nul"
    message = str(caught.value)
    assert "column 'title' of row 2 (chunk 'chunk-000') contains U+0000" in message
    assert "22021" in message  # the server's own words follow
    assert "invalid byte sequence" in message
    await sink.write(make_rows(np.arange(3)))  # not retried; the connection is still good
    await sink.close()
    check_snapshot(_snapshot(postgres.dsn, name), range(3))


async def test_a_value_the_database_refuses_is_rejected(postgres: PostgresEndpoint) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    _query(
        postgres.dsn,
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT small_doc CHECK (doc_id < 1000)").format(
            sql.Identifier(name)
        ),
    )
    with pytest.raises(RowsRejected, match=r"23514 .*small_doc") as caught:
        await sink.write(make_rows(np.arange(300)))  # doc_id reaches 7 * 299 - 1000
    assert caught.value.code == "sink_rejected_value"
    await sink.write(make_rows(np.arange(100)))
    await sink.close()
    check_snapshot(_snapshot(postgres.dsn, name), range(100))


async def test_a_configuration_problem_is_a_plain_error(postgres: PostgresEndpoint) -> None:
    name = _name()
    sink = PostgresSink(postgres.dsn)
    await sink.open(spec(name))
    _query(postgres.dsn, sql.SQL("DROP TABLE {}").format(sql.Identifier(name)))
    with pytest.raises(SinkError, match=r"42P01 .*does not exist") as caught:
        await sink.write(make_rows(np.arange(3)))
    assert type(caught.value) is SinkError
    await sink.close()


async def test_bytes_and_text_columns_round_trip(postgres: PostgresEndpoint) -> None:
    name = _name()
    table = TableSpec(name, (ColumnSpec("raw", "bytes"), ColumnSpec("label", "object")), ())
    raw = [b"\x00\x01", b"", None, bytes(range(256)), "\u00e9".encode()]
    rows = ResultRows(
        chunk_id=np.array(["c"] * 5, dtype=object),
        row_index=np.arange(5, dtype=np.int64),
        source_message_id=np.array(["m"] * 5, dtype=object),
        passthrough={
            "raw": np.array([b"garbage" if v is None else v for v in raw], dtype=object),
            "label": np.array(["a", "b", "c", "d", "e"], dtype=object),
        },
        outputs={},
        nulls={"raw": np.array([v is None for v in raw])},
        model_name="m",
        model_version="1",
        processed_at=AT,
    )
    sink = PostgresSink(postgres.dsn)
    await sink.open(table)
    await sink.write(rows)
    await sink.write(rows)  # idempotent
    await sink.close()
    assert _columns(postgres.dsn, "public", name)["raw"] == "bytea"
    got = _query(
        postgres.dsn,
        sql.SQL("SELECT raw FROM {} ORDER BY row_index").format(sql.Identifier(name)),
    )
    assert [r[0] for r in got] == raw


@pytest.mark.parametrize(("stored", "wanted"), [("text", "bytes"), ("bytea", "object")])
async def test_a_bytes_column_of_the_wrong_type_is_named(
    postgres: PostgresEndpoint, stored: str, wanted: str
) -> None:
    name = _name()
    create = sql.SQL(
        "CREATE TABLE {} (chunk_id text, row_index bigint, source_message_id text, raw {},"
        " model_name text, model_version text, processed_at timestamptz,"
        " PRIMARY KEY (chunk_id, row_index))"
    ).format(sql.Identifier(name), sql.SQL(stored))
    _query(postgres.dsn, create)
    sink = PostgresSink(postgres.dsn)
    with pytest.raises(TableMismatch, match=rf"column 'raw' is {stored}, expected") as caught:
        await sink.open(TableSpec(name, (ColumnSpec("raw", wanted),), ()))
    assert caught.value.column == "raw"


async def test_connect_failure_is_clear() -> None:
    sink = PostgresSink("postgresql://nobody:s3cret-pw@127.0.0.1:1/nowhere?connect_timeout=2")
    with pytest.raises(
        SinkUnavailable, match=r"cannot connect to PostgreSQL at 127\.0\.0\.1:1/nowhere"
    ) as caught:
        await sink.open(spec("x"))
    assert "s3cret-pw" not in str(caught.value)
    assert "postgresql://" not in str(caught.value)
    with pytest.raises(SinkError, match="not open"):
        await sink.write(make_rows(np.arange(1)))


async def test_a_wrong_database_is_a_plain_error(postgres: PostgresEndpoint) -> None:
    dsn = f"postgresql://{postgres.user}:pw-123@{postgres.host}:{postgres.port}/no_such_db"
    with pytest.raises(SinkError, match=r"does not exist") as caught:
        await PostgresSink(dsn).open(spec("x"))
    assert type(caught.value) is SinkError
    assert "pw-123" not in str(caught.value)


async def test_a_restarted_server_is_waited_for_and_written_once(tmp_path: Path) -> None:
    """A write while the server is down is SinkUnavailable; once it is back the same sink
    writes the same rows (a new connection, a new staging table), with no duplicates."""
    server = RestartablePostgres(RunDir(tmp_path))
    with server as endpoint:
        name = _name()
        sink = PostgresSink(endpoint.dsn)
        await sink.open(spec(name))
        await sink.write(make_rows(np.arange(0, 300)))
        server.interrupt()  # fast shutdown: clients are disconnected at once
        rows = make_rows(np.arange(200, 600))
        for _ in range(2):  # the retried write and the reconnect both fail while it is down
            with pytest.raises(SinkUnavailable, match=rf"127\.0\.0\.1:{endpoint.port}/"):
                await sink.write(rows)
        with pytest.raises(SinkUnavailable):
            await sink.delete_chunks(["chunk-000"])
        server.resume()  # the same port and data directory
        await sink.write(rows)  # the same rows, the same sink
        await sink.write(rows)
        await sink.close()
        check_snapshot(_snapshot(endpoint.dsn, name), range(600))


def _kill_backends(dsn: str) -> None:
    """Drops every other connection to the database, as a server restart or proxy would."""
    killed = _query(
        dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'",
    )
    assert killed, "no connection to drop"
