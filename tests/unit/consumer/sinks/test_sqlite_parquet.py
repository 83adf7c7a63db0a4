"""SqliteSink and ParquetSink on a temporary directory: storage layout, checks of an existing
table, crash recovery of the Parquet key index, and the shared spec/row checks."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import shutil
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from rowbatch.consumer.sinks.base import (
    ColumnSpec,
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    TableMismatch,
    TableSpec,
)
from rowbatch.consumer.sinks.parquet.files import DatasetFiles
from rowbatch.consumer.sinks.parquet.index import KeyIndex
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from tests.sink_data import CHUNK_ROWS, DIM, FIRST_WRITE, check_snapshot, make_rows, spec

# --- shared checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "words"),
    [
        (TableSpec("t", (ColumnSpec("row_index", "int64"),), ()), "reserved"),
        (TableSpec("t", (ColumnSpec("a", "int64"),), (ColumnSpec("a", "float32"),)), "twice"),
        (TableSpec("t", (), (ColumnSpec("big", "uint64"),)), "uint64"),
        (TableSpec("t", (), (ColumnSpec("labels", "object", 3),)), "vector"),
        (TableSpec("t", (), (ColumnSpec("when", "datetime64[us]"),)), "not supported"),
    ],
)
@pytest.mark.parametrize("kind", ["sqlite", "parquet"])
async def test_bad_specs_are_refused_at_open(
    tmp_path: Path, kind: str, table: TableSpec, words: str
) -> None:
    sink = SqliteSink(tmp_path / "db.sqlite") if kind == "sqlite" else ParquetSink(str(tmp_path))
    with pytest.raises(SinkError, match=words):
        await sink.open(table)
    await sink.close()


@pytest.mark.parametrize("kind", ["sqlite", "parquet"])
async def test_rows_that_do_not_fit_the_spec_are_refused(tmp_path: Path, kind: str) -> None:
    sink = SqliteSink(tmp_path / "db.sqlite") if kind == "sqlite" else ParquetSink(str(tmp_path))
    await sink.open(spec(dim=8))
    with pytest.raises(SinkError, match=r"'embedding' has shape \(4, 384\), expected \(4, 8\)"):
        await sink.write(make_rows(np.arange(4)))
    rows = make_rows(np.arange(4))
    lacking = ResultRows(**{**_fields(rows), "outputs": {"embedding": np.zeros((4, 8))}})
    with pytest.raises(SinkError, match="lack column 'score'"):
        await sink.write(lacking)
    await sink.close()


def _fields(rows: ResultRows) -> dict[str, Any]:
    return {name: getattr(rows, name) for name in ResultRows.__dataclass_fields__}


# --- SQLite ------------------------------------------------------------------------------------


async def test_sqlite_layout(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "results.sqlite"
    sink = SqliteSink(db)
    await sink.open(spec("results"))
    await sink.write(make_rows(np.arange(20)))
    await sink.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        info = conn.execute("PRAGMA table_info(results)").fetchall()
        assert [(r[1], r[2], r[5]) for r in info] == [
            ("chunk_id", "TEXT", 1),
            ("row_index", "INTEGER", 2),
            ("source_message_id", "TEXT", 0),
            ("doc_id", "INT64", 0),
            ("title", "TEXT", 0),
            ("embedding", f"BLOB_F32({DIM})", 0),
            ("score", "FLOAT32", 0),
            ("model_name", "TEXT", 0),
            ("model_version", "TEXT", 0),
            ("processed_at", "TEXT", 0),
        ]
        blob, at, title, kinds = conn.execute(
            "SELECT embedding, processed_at, title, typeof(embedding) || typeof(score)"
            " FROM results WHERE chunk_id = 'chunk-000' AND row_index = 3"
        ).fetchone()
        nulls = conn.execute(
            "SELECT row_index FROM results WHERE doc_id IS NULL ORDER BY row_index"
        ).fetchall()
    assert kinds == "blobreal"
    assert len(blob) == 4 * DIM
    np.testing.assert_array_equal(
        np.frombuffer(blob, "<f4"), make_rows([3]).outputs["embedding"][0]
    )
    assert at == "2024-05-01T12:30:15.123456+00:00"
    assert datetime.fromisoformat(at) == FIRST_WRITE
    assert title is None  # row 3's title is null (g % 11 == 3)
    assert nulls == [(5,), (18,)]  # doc_id is null where g % 13 == 5


async def test_sqlite_every_dtype(tmp_path: Path) -> None:
    table = TableSpec(
        "all",
        passthrough=(ColumnSpec("flag", "bool"), ColumnSpec("raw", "bytes")),
        outputs=(
            ColumnSpec("half", "float16"),
            ColumnSpec("u", "uint32"),
            ColumnSpec("votes", "bool", 3),
            ColumnSpec("wide", "float64", 2),
        ),
    )
    rows = ResultRows(
        chunk_id=np.array(["c", "c"], dtype=object),
        row_index=np.array([0, 1]),
        source_message_id=np.array(["m", "m"], dtype=object),
        passthrough={
            "flag": np.array([True, False]),
            "raw": np.array([b"\x00x", b""], dtype=object),
        },
        outputs={
            "half": np.array([0.5, 65504], dtype=np.float16),
            "u": np.array([4_294_967_295, 0], dtype=np.uint32),
            "votes": np.array([[1, 0, 1], [0, 0, 0]], dtype=bool),
            "wide": np.array([[1e-300, np.inf], [np.nan, -0.0]]),
        },
        nulls={"raw": np.array([False, True])},
        model_name="m",
        model_version="1",
        processed_at=datetime(2024, 1, 1, 0, 0),  # naive: taken as UTC
    )
    sink = SqliteSink(tmp_path / "db.sqlite")
    await sink.open(table)
    await sink.write(rows)
    await sink.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "db.sqlite")) as conn:
        got = conn.execute(
            'SELECT flag, raw, half, u, votes, wide, processed_at FROM "all" ORDER BY row_index'
        ).fetchall()
    assert got[0][:4] == (1, b"\x00x", 0.5, 4_294_967_295)
    assert got[1][:4] == (0, None, 65504.0, 0)
    assert np.frombuffer(got[0][4], "u1").tolist() == [1, 0, 1]
    wide = np.frombuffer(got[1][5], "<f8")
    assert np.isnan(wide[0])
    assert np.frombuffer(got[0][5], "<f8").tolist() == [1e-300, np.inf]
    assert got[0][6] == "2024-01-01T00:00:00.000000+00:00"


@pytest.mark.parametrize(
    ("ddl", "column", "words"),
    [
        ("score FLOAT64, embedding BLOB_F32(384)", "score", "is 'FLOAT64', expected FLOAT32"),
        ("score FLOAT32, embedding BLOB", "embedding", "expected BLOB_F32(384)"),
        ("score FLOAT32", "embedding", "lacks column 'embedding'"),
        ("score FLOAT32, embedding BLOB_F32(384), x INT NOT NULL", "x", "extra NOT NULL"),
    ],
)
async def test_sqlite_incompatible_table_is_named(
    tmp_path: Path, ddl: str, column: str, words: str
) -> None:
    db = tmp_path / "db.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute(
            "CREATE TABLE results (chunk_id TEXT, row_index INTEGER, source_message_id TEXT,"
            " doc_id INT64, title TEXT, model_name TEXT, model_version TEXT, processed_at TEXT,"
            f" {ddl}, PRIMARY KEY (chunk_id, row_index))"
        )
    sink = SqliteSink(db)
    with pytest.raises(TableMismatch, match=re.escape(words)) as caught:
        await sink.open(spec("results"))
    assert caught.value.column == column


async def test_sqlite_table_without_the_key_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    sink = SqliteSink(db)
    await sink.open(spec("results"))
    await sink.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("DROP TABLE results")
        conn.execute(
            "CREATE TABLE results (chunk_id TEXT, row_index INTEGER, source_message_id TEXT,"
            " doc_id INT64, title TEXT, embedding BLOB_F32(384), score FLOAT32,"
            " model_name TEXT, model_version TEXT, processed_at TEXT)"
        )
    with pytest.raises(TableMismatch, match=r"primary key \[\], expected"):
        await SqliteSink(db).open(spec("results"))


async def test_sqlite_odd_table_names_and_concurrent_writes(tmp_path: Path) -> None:
    name = 'odd "name"; DROP TABLE x; --'
    sink = SqliteSink(tmp_path / "db.sqlite")
    await sink.open(spec(name))
    await asyncio.gather(
        *(sink.write(make_rows(np.arange(a, a + 400))) for a in range(0, 2_000, 200))
    )
    await sink.delete_chunks(["chunk-001", "x'); DROP TABLE y; --"])
    await sink.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "db.sqlite")) as conn:
        (count,) = conn.execute('SELECT count(*) FROM "odd ""name""; DROP TABLE x; --"').fetchone()
    assert count == 2_200 - CHUNK_ROWS


async def test_sqlite_a_cancelled_write_leaves_the_sink_usable(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "db.sqlite")
    await sink.open(spec())
    task = asyncio.create_task(sink.write(make_rows(np.arange(3_000))))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await sink.write(make_rows(np.arange(3_000)))
    await sink.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "db.sqlite")) as conn:
        assert conn.execute("SELECT count(*) FROM results").fetchone() == (3_000,)


# --- Parquet -----------------------------------------------------------------------------------


def _dataset(root: Path) -> pa.Table:
    return ds.dataset(root, partitioning="hive").to_table()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _data_files(root: Path) -> list[str]:
    """The dataset's visible data files (those readers see)."""
    return [f for f in _files(root) if f.endswith(".parquet") and "/." not in f]


def _tmp_files(root: Path) -> list[str]:
    """Data files being written or waiting for a commit (hidden from readers)."""
    return [f for f in _files(root) if f.endswith(".parquet.tmp")]


def _snap(table: pa.Table) -> dict[str, Any]:
    snap: dict[str, Any] = {n: table[n].to_pylist() for n in table.column_names}
    emb = table["embedding"].combine_chunks()
    snap["embedding"] = emb.values.to_numpy().reshape(-1, DIM)
    return snap


async def test_parquet_layout_and_partitions(tmp_path: Path) -> None:
    root = tmp_path / "data"
    sink = ParquetSink(str(root))
    await sink.open(spec())
    next_day = FIRST_WRITE + timedelta(days=1)
    await sink.write(make_rows(np.arange(0, 300)))
    await sink.write(make_rows(np.arange(300, 500), processed_at=next_day))
    await sink.commit()
    await sink.close()
    files = _files(root)
    data = [f for f in files if f.endswith(".parquet")]
    assert [f.split("/")[0] for f in data] == [  # one file per partition after the commit
        "processed_date=2024-05-01",
        "processed_date=2024-05-02",
    ]
    assert all(
        re.fullmatch(r"processed_date=[-\d]+/part-\d{8}T\d{12}-[0-9a-f]{32}\.parquet", f)
        for f in data
    )
    assert all(f.startswith(("processed_date=", "_rowbatch/")) for f in files), files
    assert not [f for f in files if ".tmp" in f]
    table = _dataset(root)
    assert table.num_rows == 500
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), DIM)
    assert table.schema.field("processed_at").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("doc_id").type == pa.int64()
    dates = table["processed_date"].to_pylist()
    assert dates.count("2024-05-01") == 300
    assert dates.count("2024-05-02") == 200
    # each file reads on its own too, with the same schema
    for rel in data:
        assert pq.read_schema(root / rel).names == [
            n for n in table.schema.names if n != "processed_date"
        ]


async def test_parquet_relative_path_and_file_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sink = ParquetSink("rel/data")
    await sink.open(spec())
    await sink.write(make_rows(np.arange(10)))
    await sink.commit()
    await sink.close()
    sink = ParquetSink((tmp_path / "rel" / "data").as_uri())
    await sink.open(spec())
    assert await sink.write(make_rows(np.arange(20))) == 10  # the same dataset and index
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path / "rel" / "data")), range(20))


async def test_parquet_a_second_writer_is_refused(tmp_path: Path) -> None:
    first = ParquetSink(str(tmp_path))
    await first.open(spec())
    second = ParquetSink(str(tmp_path))
    with pytest.raises(SinkError, match="one writer per dataset"):
        await second.open(spec())
    await first.close()
    await second.open(spec())  # free once the first closed
    await second.close()


def _index(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "_rowbatch" / "keys.sqlite", isolation_level=None)


class _Crash(Exception):
    """Stands in for the process dying at a given step."""


async def test_parquet_crash_after_rename_is_committed_on_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies in ``commit`` between renaming a data file into place and marking it
    committed in the index: the next open finds the file in place and commits it, keys kept."""
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    await sink.write(make_rows(np.arange(100)))

    def crash(index: KeyIndex, file_id: int) -> None:
        raise _Crash

    monkeypatch.setattr(KeyIndex, "commit", crash)
    with pytest.raises(_Crash):
        await sink.commit()
    monkeypatch.undo()
    await sink.close()
    assert len(_data_files(tmp_path)) == 1  # renamed into place
    assert not _tmp_files(tmp_path)
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT state FROM files").fetchall() == [("pending",)]
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())  # reconciles: the file exists, so it is committed
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT state FROM files").fetchall() == [("committed",)]
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (100,)
    assert await sink.write(make_rows(np.arange(150))) == 50  # its rows are not written twice
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(150))


async def test_parquet_crash_before_rename_is_dropped_on_open(tmp_path: Path) -> None:
    """The process dies after rows were streamed into data files (one rolled, waiting for the
    commit; one still open) but before a commit renamed them: the next open deletes their
    temporary files and forgets their keys, so the redelivered rows are written again."""
    sink = ParquetSink(str(tmp_path), target_file_bytes=1024 * 1024)  # row groups of 128 KiB
    await sink.open(spec())
    await sink.write(make_rows(np.arange(100)))
    await sink.commit()
    for start in range(100, 1_000, 100):  # a file rolled at 1 MiB, and the next one begun
        await sink.write(make_rows(np.arange(start, start + 100)))
    await sink.close()  # stands in for the crash: no commit
    tmp = _tmp_files(tmp_path)
    assert len(tmp) == 2, tmp
    torn = tmp_path / tmp[1]  # the open one: a crash leaves it cut short, without a footer
    torn.write_bytes(torn.read_bytes()[:1_000])
    assert len(_data_files(tmp_path)) == 1
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT count(*) FROM files WHERE state = 'pending'").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (1_000,)
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    assert not _tmp_files(tmp_path)
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT state FROM files").fetchall() == [("committed",)]
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (100,)
    check_snapshot(_snap(_dataset(tmp_path)), range(100))
    # the keys were freed: rows 100..999 land
    assert await sink.write(make_rows(np.arange(1_000))) == 900
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(1_000))


async def test_parquet_a_failed_write_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is full when a write opens a new data file (its rows fill a row group, so it
    streams them out at once): the write is unavailable and leaves no file; once retried and
    committed, every row is there once."""
    sink = ParquetSink(str(tmp_path), target_file_bytes=1024 * 1024)  # row groups of 128 KiB
    await sink.open(spec())

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (test)")

    monkeypatch.setattr(DatasetFiles, "open_output", full)
    with pytest.raises(SinkUnavailable, match="No space left on device"):
        await sink.write(make_rows(np.arange(100)))
    monkeypatch.undo()
    assert not [f for f in _files(tmp_path) if not f.startswith("_rowbatch/")]
    await sink.write(make_rows(np.arange(100)))  # the retry
    assert not _data_files(tmp_path)  # nothing is visible before the commit
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(100))
    assert len(_data_files(tmp_path)) == 1
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT state FROM files").fetchall() == [("committed",)]


async def test_parquet_a_write_the_store_failed_under_is_retried_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the publish (the rename at commit), and every look at it (it is down):
    the rows stay staged, a redelivery of them is not staged twice, writes go on meanwhile,
    and the commit retried once the store is back publishes each row once."""
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    await sink.write(make_rows(np.arange(50)))
    await sink.commit()
    assert await sink.write(make_rows(np.arange(100))) == 50

    def slow_down(*args: Any, **kwargs: Any) -> None:
        raise OSError("AWS Error SLOW_DOWN during CopyObject operation: Please reduce your rate")

    monkeypatch.setattr(DatasetFiles, "finish", slow_down)
    monkeypatch.setattr(DatasetFiles, "exists", slow_down)
    with pytest.raises(SinkUnavailable, match="SLOW_DOWN"):
        await sink.commit()
    with pytest.raises(SinkUnavailable, match="SLOW_DOWN"):  # still down
        await sink.commit()
    assert await sink.write(make_rows(np.arange(100))) == 0  # a redelivery: staged already
    assert await sink.write(make_rows(np.arange(100, 120))) == 20
    check_snapshot(_snap(_dataset(tmp_path)), range(50))
    monkeypatch.undo()
    await sink.commit()  # the same commit, once the store is back
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(120))
    assert not _tmp_files(tmp_path)
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT count(*) FROM files WHERE state = 'pending'").fetchone() == (0,)


async def test_parquet_a_value_pyarrow_cannot_convert_is_rejected(tmp_path: Path) -> None:
    table = TableSpec("t", (ColumnSpec("raw", "bytes"), ColumnSpec("label", "str")), ())
    rows = ResultRows(
        chunk_id=np.array(["c", "c"], dtype=object),
        row_index=np.array([0, 1]),
        source_message_id=np.array(["m", "m"], dtype=object),
        passthrough={
            "raw": np.array([b"ok", 5], dtype=object),
            "label": np.array(["a", "b"], dtype=object),
        },
        outputs={},
        nulls={},
        model_name="m",
        model_version="1",
        processed_at=FIRST_WRITE,
    )
    sink = ParquetSink(str(tmp_path))
    await sink.open(table)
    with pytest.raises(RowsRejected, match=r"column 'raw': pyarrow cannot store a value as binary"):
        await sink.write(rows)
    assert sink.uncommitted_bytes() == 0  # nothing of it was staged
    good = ResultRows(
        **{
            **_fields(rows),
            "passthrough": {**rows.passthrough, "raw": np.array([b"ok", None], dtype=object)},
        }
    )
    assert await sink.write(good) == 2  # the sink is fine, and the keys were not claimed
    await sink.commit()
    await sink.close()
    assert _dataset(tmp_path)["raw"].to_pylist() == [b"ok", None]


async def test_sqlite_a_locked_database_is_unavailable_then_written(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    sink = SqliteSink(db, busy_timeout_s=0.05)
    await sink.open(spec())
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    rows = make_rows(np.arange(100))
    with pytest.raises(SinkUnavailable, match="database is locked"):
        await sink.write(rows)
    with pytest.raises(SinkUnavailable, match="database is locked"):
        await sink.delete_chunks(["chunk-000"])
    blocker.execute("ROLLBACK")
    blocker.close()
    await sink.write(rows)  # the same rows, the same sink
    await sink.write(rows)
    await sink.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM results").fetchone() == (100,)


async def test_sqlite_a_value_it_cannot_bind_is_rejected(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "db.sqlite")
    await sink.open(spec())
    rows = make_rows(np.arange(3))
    rows.passthrough["title"][1] = {"not": "text"}
    with pytest.raises(RowsRejected, match=r"type 'dict' is not supported \(column 'title'\)"):
        await sink.write(rows)
    await sink.write(make_rows(np.arange(3)))
    await sink.close()


async def test_parquet_delete_rewrites_only_affected_files(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    for start, stop in ((0, 400), (400, 1_200), (1_200, 1_500)):  # a file per commit:
        await sink.write(make_rows(np.arange(start, stop)))  # chunk-000; -000..-002; -002
        await sink.commit()
    before = {f: (tmp_path / f).stat().st_mtime_ns for f in _data_files(tmp_path)}
    await sink.delete_chunks(["chunk-000"])
    after = {f: (tmp_path / f).stat().st_mtime_ns for f in _data_files(tmp_path)}
    assert len(before) == 3
    assert len(after) == 2  # the chunk-000-only file is gone
    untouched = [f for f in after if after[f] == before[f]]
    assert len(untouched) == 1  # the chunk-002 file was not rewritten
    check_snapshot(_snap(_dataset(tmp_path)), range(CHUNK_ROWS, 1_500))
    with contextlib.closing(_index(tmp_path)) as conn:
        assert conn.execute("SELECT count(*) FROM files").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (1_000,)
        assert conn.execute("SELECT count(*) FROM deletions").fetchone() == (0,)
    await sink.delete_chunks(["chunk-001", "chunk-002"])  # empties every file
    assert not _data_files(tmp_path)
    assert not _tmp_files(tmp_path)
    assert await sink.write(make_rows(np.arange(1_500))) == 1_500
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(1_500))


async def test_parquet_interrupted_delete_is_finished_on_open(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    await sink.write(make_rows(np.arange(1_000)))
    await sink.commit()
    await sink.close()
    with contextlib.closing(_index(tmp_path)) as conn:  # journalled, then the process died
        conn.execute("INSERT INTO deletions VALUES ('chunk-001')")
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    check_snapshot(_snap(_dataset(tmp_path)), range(CHUNK_ROWS))
    assert await sink.write(make_rows(np.arange(1_000))) == CHUNK_ROWS
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(1_000))


async def test_parquet_lost_index_is_rebuilt_from_the_files(tmp_path: Path) -> None:
    """The index is rebuilt from the committed files only: rows staged but never committed
    (a temporary file left behind) are not adopted, so their rewrite is accepted."""
    sink = ParquetSink(str(tmp_path), target_file_bytes=1024 * 1024)  # row groups of 128 KiB
    await sink.open(spec())
    await sink.write(make_rows(np.arange(0, 700)))
    await sink.commit()
    await sink.write(make_rows(np.arange(700, 900)))
    await sink.commit()
    await sink.write(make_rows(np.arange(900, 1_000)))  # streamed out, never committed
    await sink.close()
    assert len(_tmp_files(tmp_path)) == 1
    shutil.rmtree(tmp_path / "_rowbatch")
    sink = ParquetSink(str(tmp_path))
    await sink.open(spec())
    assert await sink.write(make_rows(np.arange(0, 1_000))) == 100
    await sink.commit()
    await sink.close()
    check_snapshot(_snap(_dataset(tmp_path)), range(1_000))
    shutil.rmtree(tmp_path / "_rowbatch")
    with pytest.raises(TableMismatch, match="embedding") as caught:
        await ParquetSink(str(tmp_path)).open(spec(dim=16))
    assert caught.value.column == "embedding"


async def test_parquet_object_store_keeps_its_index_locally(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="needs index_path"):
        ParquetSink("mock:///bucket/results")
    sink = ParquetSink("mock:///bucket/results", index_path=tmp_path / "index.sqlite")
    await sink.open(spec())
    await sink.write(make_rows(np.arange(300)))
    await sink.write(make_rows(np.arange(200, 600)))
    await sink.delete_chunks(["chunk-000"])
    filesystem = sink._fs  # the mock filesystem lives in this process only
    await sink.close()
    table = ds.dataset("bucket/results", filesystem=filesystem, partitioning="hive").to_table()
    check_snapshot(_snap(table), range(CHUNK_ROWS, 600))
    assert (tmp_path / "index.sqlite").exists()
