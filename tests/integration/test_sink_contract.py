"""One behaviour suite, run against every sink: idempotent writes under redelivery, deletes,
reopening, a clear error for an incompatible existing table, and every wire type (bytes,
text holding U+0000) stored faithfully or refused as RowsRejected. A sink that stages its
writes until a commit (``CommitsWrites``: Parquet) is committed where the pipeline would
commit, before the table is read or the sink closed."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow.dataset as ds
import pytest
from psycopg import sql

from rowbatch.consumer.sinks.base import (
    ColumnSpec,
    CommitsWrites,
    ResultRows,
    RowsRejected,
    Sink,
    SinkError,
    TableMismatch,
    TableSpec,
)
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.postgres.sink import PostgresSink
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from tests.sink_data import (
    CHUNK_ROWS,
    DIM,
    FIRST_WRITE,
    RAW_VALUES,
    TEXT_VALUES,
    TEXT_WITH_NUL,
    Snapshot,
    batches,
    check_snapshot,
    make_rows,
    spec,
    wire_types_rows,
    wire_types_spec,
)

TOTAL = 10_000
BATCH = 1_000


@dataclass
class Target:
    """A sink kind at one location: makes sinks there and reads the table back."""

    kind: str
    table: TableSpec
    make: Callable[[], Sink]
    read: Callable[[], Snapshot]
    #: (table name, columns) -> the rows' values, ordered by (chunk_id, row_index)
    select: Callable[[str, Sequence[str]], list[tuple[Any, ...]]]

    @contextlib.asynccontextmanager
    async def opened(self, table: TableSpec | None = None) -> AsyncIterator[Sink]:
        sink = self.make()
        await sink.open(table or self.table)
        try:
            yield sink
        finally:
            await sink.close()


def _read_sqlite(path: Path, name: str) -> Snapshot:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT chunk_id, row_index, source_message_id, doc_id, title, embedding, score,"
            f' model_name, model_version, processed_at FROM "{name}"'
        ).fetchall()
    cols = list(zip(*rows, strict=True)) if rows else [()] * 10
    return {
        "chunk_id": list(cols[0]),
        "row_index": list(cols[1]),
        "source_message_id": list(cols[2]),
        "doc_id": list(cols[3]),
        "title": list(cols[4]),
        "embedding": np.array([np.frombuffer(b, "<f4") for b in cols[5]]).reshape(-1, DIM),
        "score": list(cols[6]),
        "model_name": list(cols[7]),
        "model_version": list(cols[8]),
        "processed_at": [datetime.fromisoformat(t) for t in cols[9]],
    }


def _read_postgres(dsn: str, name: str) -> Snapshot:
    query = sql.SQL(
        "SELECT chunk_id, row_index, source_message_id, doc_id, title, embedding, score,"
        " model_name, model_version, processed_at FROM {}"
    ).format(sql.Identifier(name))
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    cols = list(zip(*rows, strict=True)) if rows else [()] * 10
    names = ["chunk_id", "row_index", "source_message_id", "doc_id", "title"]
    snap: dict[str, Any] = {n: list(c) for n, c in zip(names, cols, strict=False)}
    snap["embedding"] = np.array(cols[5], dtype=np.float32).reshape(-1, DIM)
    snap.update(
        score=list(cols[6]),
        model_name=list(cols[7]),
        model_version=list(cols[8]),
        processed_at=list(cols[9]),
    )
    return snap


_COLUMNS = (
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
)


def _read_parquet(root: Path) -> Snapshot:
    table = ds.dataset(root, partitioning="hive").to_table()
    if table.num_rows == 0:
        return {name: np.zeros((0, DIM)) if name == "embedding" else [] for name in _COLUMNS}
    snap: dict[str, Any] = {
        name: table[name].to_pylist()
        for name in table.column_names
        if name not in ("embedding", "processed_date")
    }
    emb = table["embedding"].combine_chunks()
    snap["embedding"] = emb.values.to_numpy().reshape(-1, DIM)
    dates = table["processed_date"].to_pylist()
    assert all(
        str(d) == t.astimezone(UTC).date().isoformat()
        for d, t in zip(dates, snap["processed_at"], strict=True)
    )
    return snap


def _select_sqlite(db: Path, name: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    listed = ", ".join(f'"{c}"' for c in columns)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        query = f'SELECT {listed} FROM "{name}" ORDER BY chunk_id, row_index'
        return [tuple(r) for r in conn.execute(query).fetchall()]


def _select_postgres(dsn: str, name: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT {} FROM {} ORDER BY chunk_id, row_index").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(name)
    )
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(query).fetchall()]


def _select_parquet(root: Path, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    if not root.exists():
        return []
    table = ds.dataset(root, partitioning="hive").to_table()
    table = table.sort_by([("chunk_id", "ascending"), ("row_index", "ascending")])
    return list(zip(*(table[c].to_pylist() for c in columns), strict=True))


@pytest.fixture(params=["sqlite", "postgres", "parquet"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    name = f"results_{uuid.uuid4().hex[:10]}"
    table = spec(name)
    kind: str = request.param
    if kind == "sqlite":
        db = tmp_path / "results.sqlite"
        return Target(
            kind,
            table,
            lambda: SqliteSink(db),
            lambda: _read_sqlite(db, name),
            lambda n, cols: _select_sqlite(db, n, cols),
        )
    if kind == "postgres":
        dsn: str = request.getfixturevalue("postgres").dsn
        return Target(
            kind,
            table,
            lambda: PostgresSink(dsn),
            lambda: _read_postgres(dsn, name),
            lambda n, cols: _select_postgres(dsn, n, cols),
        )
    root = tmp_path / "dataset"
    return Target(
        kind,
        table,
        lambda: ParquetSink(str(root)),
        lambda: _read_parquet(root),
        lambda n, cols: _select_parquet(root, cols),
    )


async def _commit(sink: Sink) -> None:
    """Makes what was written part of the table (where the pipeline's commit stage would, for
    a sink that stages its writes); nothing to do for the others."""
    if isinstance(sink, CommitsWrites):
        await sink.commit()


async def _write_all(sink: Sink, rows: list[ResultRows]) -> None:
    """Writes each batch; every row is new, and each write says it stored all of them."""
    for batch in rows:
        assert await sink.write(batch) == len(batch)


async def test_redelivered_rows_are_written_once(target: Target) -> None:
    async with target.opened() as sink:
        await _write_all(sink, [make_rows(b) for b in batches(0, TOTAL, BATCH)])
        await _commit(sink)
        check_snapshot(target.read(), range(TOTAL))
        # Redelivery: overlapping batches with other boundaries, a later time (another day for
        # the Parquet partitions) and a newer model version: the first write stays.
        later = FIRST_WRITE + timedelta(days=1, hours=3)
        again = [
            np.arange(500, 2_500),
            np.arange(9_500, TOTAL),
            np.concatenate([np.arange(3_000, 3_100), np.arange(3_000, 3_050)]),  # repeats
            np.arange(4_321, 4_322),
        ]
        for g in again:
            stored = await sink.write(make_rows(g, processed_at=later, model_version="2"))
            assert stored == 0, "rows already there are skipped, and not counted as written"
        await _commit(sink)
    check_snapshot(target.read(), range(TOTAL))


async def test_partly_new_batches_write_only_the_new_rows(target: Target) -> None:
    async with target.opened() as sink:
        assert await sink.write(make_rows(np.arange(0, 600))) == 600
        partly = make_rows(np.arange(400, 1_000), garbage_under_nulls=True)
        assert await sink.write(partly) == 400  # 600..999: the new ones only
        assert await sink.write(make_rows(np.arange(1_000, 1_200)[::-1])) == 200  # any order
        await _commit(sink)
    check_snapshot(target.read(), range(1_200))


async def test_delete_chunks_removes_exactly_those_chunks(target: Target) -> None:
    async with target.opened() as sink:
        await _write_all(sink, [make_rows(b) for b in batches(0, TOTAL, BATCH)])
        await _commit(sink)
        await sink.delete_chunks(["chunk-003", "chunk-007", "chunk-unknown"])
        gone = set(range(3 * CHUNK_ROWS, 4 * CHUNK_ROWS)) | set(
            range(7 * CHUNK_ROWS, 8 * CHUNK_ROWS)
        )
        check_snapshot(target.read(), sorted(set(range(TOTAL)) - gone))
        await sink.delete_chunks(["chunk-003"])  # again: nothing left to remove
        await sink.delete_chunks([])
        check_snapshot(target.read(), sorted(set(range(TOTAL)) - gone))
        # A deleted chunk can be written again (the keys are free).
        again = make_rows(np.arange(3 * CHUNK_ROWS, 4 * CHUNK_ROWS))
        assert await sink.write(again) == CHUNK_ROWS
        assert await sink.write(make_rows(np.arange(TOTAL))) == CHUNK_ROWS  # chunk 7's rows
        await _commit(sink)
    check_snapshot(target.read(), range(TOTAL))


async def test_reopening_an_existing_table_keeps_writes_idempotent(target: Target) -> None:
    async with target.opened() as sink:
        await sink.write(make_rows(np.arange(0, 3_000)))
        await _commit(sink)
    async with target.opened() as sink:
        assert await sink.write(make_rows(np.arange(2_000, 5_000))) == 2_000  # 3,000..4,999
        await _commit(sink)
    async with target.opened() as sink:
        await sink.delete_chunks(["chunk-000"])
        await _commit(sink)
    check_snapshot(target.read(), range(CHUNK_ROWS, 5_000))


@pytest.mark.parametrize(
    ("change", "column"),
    [({"dim": 256}, "embedding"), ({"score": "float64"}, "score")],
)
async def test_an_incompatible_existing_table_is_named(
    target: Target, change: dict[str, Any], column: str
) -> None:
    async with target.opened() as sink:
        await sink.write(make_rows(np.arange(10)))
        await _commit(sink)
    other = spec(target.table.name, **change)
    with pytest.raises(TableMismatch, match=column) as caught:
        async with target.opened(other):
            pass
    assert caught.value.column == column
    async with target.opened() as sink:  # the original spec still opens
        assert await sink.write(make_rows(np.arange(10))) == 0  # and the rows are there
        await _commit(sink)
    check_snapshot(target.read(), range(10))


async def test_empty_writes_and_unopened_sinks(target: Target) -> None:
    sink = target.make()
    with pytest.raises(SinkError, match="not open"):
        await sink.write(make_rows(np.arange(3)))
    async with target.opened() as sink:
        assert await sink.write(make_rows(np.arange(0))) == 0
        await sink.delete_chunks([])
        await _commit(sink)  # a commit with nothing staged
    check_snapshot(target.read(), [])


async def test_bytes_are_stored_byte_for_byte(target: Target) -> None:
    """The wire's bytes kind: raw bytes (NUL and 0xFF included, empty) and nulls as NULL."""
    table = wire_types_spec(target.table.name)
    async with target.opened(table) as sink:
        await sink.write(wire_types_rows("chunk-a"))
        await sink.write(wire_types_rows("chunk-a"))  # redelivered: still once
        await sink.write(wire_types_rows("chunk-b"))
        await _commit(sink)
    got = target.select(table.name, ["chunk_id", "row_index", "raw", "label", "score"])
    want = [
        (chunk, i, raw, TEXT_VALUES[i], i / 4)
        for chunk in ("chunk-a", "chunk-b")
        for i, raw in enumerate(RAW_VALUES)
    ]
    assert [(c, int(i), None if r is None else bytes(r), t, s) for c, i, r, t, s in got] == want
    async with target.opened(table):  # the existing table fits the spec
        pass
    as_text = TableSpec(
        table.name, (ColumnSpec("raw", "object"), *table.passthrough[1:]), table.outputs
    )
    with pytest.raises(TableMismatch, match="'raw'") as caught:  # ... but not as text
        async with target.opened(as_text):
            pass
    assert caught.value.column == "raw"


async def test_text_holding_nul_is_stored_or_rejected(target: Target) -> None:
    """U+0000 in text: SQLite and Parquet store it losslessly; PostgreSQL cannot store it in
    ``text`` and rejects the write (RowsRejected, code ``text_contains_nul``, the column named),
    leaving nothing of it behind, while other writes go on."""
    table = wire_types_spec(target.table.name)
    bad = wire_types_rows("chunk-nul", label_at={4: TEXT_WITH_NUL})
    async with target.opened(table) as sink:
        await sink.write(wire_types_rows("chunk-a"))
        if target.kind == "postgres":
            with pytest.raises(RowsRejected, match="column 'label' of row 4") as caught:
                await sink.write(bad)
            assert caught.value.code == "text_contains_nul"
        else:
            await sink.write(bad)
        await sink.write(wire_types_rows("chunk-b"))
        await _commit(sink)
    got = target.select(table.name, ["chunk_id", "row_index", "label"])
    labels = {(c, int(i)): t for c, i, t in got}
    chunks = sorted({c for c, _ in labels})
    if target.kind == "postgres":
        assert chunks == ["chunk-a", "chunk-b"]
    else:
        assert chunks == ["chunk-a", "chunk-b", "chunk-nul"]
        assert labels[("chunk-nul", 4)] == TEXT_WITH_NUL
        assert len(labels[("chunk-nul", 4)]) == len("before") + 1 + len("after")
    assert labels[("chunk-b", 1)] == TEXT_VALUES[1]
