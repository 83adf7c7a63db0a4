"""The Parquet sink's large files: rows are streamed into one open file per day partition
(a hidden temporary name), the file is rolled at ``target_file_bytes``, and ``commit`` publishes
every file (renamed into place): rows are in the dataset only after it."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from rowbatch.consumer.sinks.base import CommitsWrites, SinkError, SinkUnavailable
from rowbatch.consumer.sinks.parquet.files import DatasetFiles
from rowbatch.consumer.sinks.parquet.index import KeyIndex
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.rolling import held_bytes, row_group_bytes_for
from tests.sink_data import CHUNK_ROWS, DIM, FIRST_WRITE, check_snapshot, make_rows, spec

KIB = 1024
#: A target at which each write of 100 rows (about 160 KiB of Arrow data) is a row group of
#: its own, streamed out at once (row groups are gathered to an eighth of the target).
STREAMING_TARGET = 1024 * KIB

Sinks = Callable[..., Awaitable[ParquetSink]]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def sinks(root: Path) -> AsyncIterator[Sinks]:
    """Opens sinks on ``root`` (keyword arguments go to ``ParquetSink``); all are closed at
    the end, also when a test fails."""
    opened: list[ParquetSink] = []

    async def make(**kwargs: Any) -> ParquetSink:
        sink = ParquetSink(str(root), **kwargs)
        opened.append(sink)
        await sink.open(spec())
        return sink

    yield make
    for sink in opened:
        await sink.close()


def _data_files(root: Path) -> list[Path]:
    """The dataset's visible data files."""
    return sorted(root.rglob("part-*.parquet"))


def _tmp_files(root: Path) -> list[Path]:
    """Data files being written or waiting for a commit (hidden from readers)."""
    return sorted(root.rglob(".part-*.parquet.tmp"))


def _dataset(root: Path) -> pa.Table:
    """What a reader sees."""
    return ds.dataset(root, partitioning="hive").to_table()


def _snap(table: pa.Table) -> dict[str, Any]:
    snap: dict[str, Any] = {n: table[n].to_pylist() for n in table.column_names}
    snap["embedding"] = table["embedding"].combine_chunks().values.to_numpy().reshape(-1, DIM)
    return snap


def _index(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "_rowbatch" / "keys.sqlite", isolation_level=None)


def _states(root: Path) -> list[str]:
    with contextlib.closing(_index(root)) as conn:
        return [str(s) for (s,) in conn.execute("SELECT state FROM files ORDER BY id")]


# --- one file per partition, published at the commit ----------------------------------------


async def test_many_writes_make_one_file_per_partition_per_commit(sinks: Sinks, root: Path) -> None:
    sink = await sinks()
    assert isinstance(sink, CommitsWrites)
    next_day = FIRST_WRITE + timedelta(days=1)
    for start in range(0, 1_000, 50):  # 20 writes a day, the days interleaved
        await sink.write(make_rows(np.arange(start, start + 50)))
        await sink.write(make_rows(np.arange(start + 1_000, start + 1_050), processed_at=next_day))
    await sink.commit()
    files = _data_files(root)
    assert [f.parent.name for f in files] == [
        "processed_date=2024-05-01",
        "processed_date=2024-05-02",
    ]
    assert [pq.read_metadata(f).num_rows for f in files] == [1_000, 1_000]
    table = _dataset(root)
    first = table.filter(pc.equal(table["processed_date"], "2024-05-01"))
    second = table.filter(pc.equal(table["processed_date"], "2024-05-02"))
    check_snapshot(_snap(first), range(1_000))
    check_snapshot(_snap(second), range(1_000, 2_000), processed_at=next_day)

    await sink.write(make_rows(np.arange(2_000, 2_100)))  # the next commit: files of its own
    await sink.commit()
    assert len(_data_files(root)) == 3
    assert _states(root) == ["committed"] * 3
    assert not _tmp_files(root)


async def test_rows_are_invisible_until_the_commit(sinks: Sinks, root: Path) -> None:
    sink = await sinks(target_file_bytes=STREAMING_TARGET)
    await sink.write(make_rows(np.arange(300)))
    assert len(_tmp_files(root)) == 1  # streamed out already, under a hidden name
    assert _dataset(root).num_rows == 0
    assert not _data_files(root)
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(300))
    assert not _tmp_files(root)

    await sink.write(make_rows(np.arange(300, 400)))
    check_snapshot(_snap(_dataset(root)), range(300))  # the new rows wait for the next commit
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(400))


async def test_files_are_rolled_at_the_target_size(sinks: Sinks, root: Path) -> None:
    target = 64 * KIB
    sink = await sinks(target_file_bytes=target)
    for start in range(0, 1_000, 10):  # 100 small writes, about 1.6 MB
        await sink.write(make_rows(np.arange(start, start + 10)))
    assert len(_tmp_files(root)) >= 3  # the full files are closed, waiting for the commit
    assert not _data_files(root)
    await sink.commit()
    files = _data_files(root)
    sizes = [f.stat().st_size for f in files]
    assert len(files) >= 3, sizes  # several files, not one per write nor one in all
    assert len(files) < 50, sizes
    # a file is rolled at the first row group that takes it past the target: every file is
    # at least the target (the last one, closed by the commit, may be smaller) and not much more
    assert all(size <= 2 * target for size in sizes), sizes
    assert sum(size < target for size in sizes) <= 1, sizes
    assert sum(pq.read_metadata(f).num_rows for f in files) == 1_000
    check_snapshot(_snap(_dataset(root)), range(1_000))
    assert _states(root) == ["committed"] * len(files)


# --- idempotency ------------------------------------------------------------------------------


async def test_a_key_written_twice_before_a_commit_is_stored_once(sinks: Sinks, root: Path) -> None:
    sink = await sinks()
    assert await sink.write(make_rows(np.arange(100))) == 100
    assert await sink.write(make_rows(np.arange(50, 150))) == 50  # redelivered into the open file
    assert await sink.write(make_rows([150, 150, 151])) == 2  # repeated in one write
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(152))
    assert len(_data_files(root)) == 1

    assert await sink.write(make_rows(np.arange(152))) == 0  # committed: skipped
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(152))
    assert len(_data_files(root)) == 1
    assert _states(root) == ["committed"]  # the file begun for nothing was forgotten
    with contextlib.closing(_index(root)) as conn:
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (152,)


@pytest.mark.parametrize("target", [128 * 1024 * KIB, STREAMING_TARGET], ids=["held", "streamed"])
async def test_a_staged_chunk_deleted_is_gone_and_written_again(
    sinks: Sinks, root: Path, target: int
) -> None:
    """A chunk deleted while its rows are staged (held for the next row group, or streamed out
    into the open file already) is not in the dataset after the commit, and its rewrite (a
    replay of the dead letter) is accepted."""
    sink = await sinks(target_file_bytes=target)
    for start in range(0, 600, 100):  # chunk-000 whole, and chunk-001's first 100 rows
        await sink.write(make_rows(np.arange(start, start + 100)))
    await sink.delete_chunks(["chunk-000"])
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(CHUNK_ROWS, 600))
    with contextlib.closing(_index(root)) as conn:
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (100,)
        assert conn.execute("SELECT count(*) FROM deletions").fetchone() == (0,)

    assert await sink.write(make_rows(np.arange(CHUNK_ROWS))) == CHUNK_ROWS
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(600))
    assert not _tmp_files(root)


# --- crashes and store failures ---------------------------------------------------------------


async def test_rows_not_committed_before_a_crash_are_gone_and_written_again(
    sinks: Sinks, root: Path
) -> None:
    sink = await sinks(target_file_bytes=STREAMING_TARGET)
    await sink.write(make_rows(np.arange(200)))
    await sink.commit()
    await sink.write(make_rows(np.arange(200, 400)))
    await sink.close()  # stands in for the crash: no commit

    again = await sinks()
    check_snapshot(_snap(_dataset(root)), range(200))
    assert not _tmp_files(root)
    assert _states(root) == ["committed"]
    assert await again.write(make_rows(np.arange(400))) == 200  # the uncommitted rows land
    await again.commit()
    check_snapshot(_snap(_dataset(root)), range(400))


async def test_a_file_failing_midway_stops_the_sink_and_its_rows_are_written_again(
    sinks: Sinks, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails while a row group is streamed into the open file: the rows it held are
    gone, so the sink refuses to go on (not a transient fault, even if the store's words say
    so); after a reopen the dataset holds none of that file's rows, and they can be written
    again."""
    sink = await sinks(target_file_bytes=STREAMING_TARGET)
    await sink.write(make_rows(np.arange(100)))
    await sink.commit()

    write_table = pq.ParquetWriter.write_table
    groups = 0

    def failing(writer: pq.ParquetWriter, table: pa.Table, *args: Any, **kwargs: Any) -> None:
        nonlocal groups
        groups += 1
        if groups == 2:
            raise OSError(errno.ECONNRESET, "Connection reset by peer (test)")
        write_table(writer, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    await sink.write(make_rows(np.arange(100, 200)))  # the new file's first row group
    with pytest.raises(SinkError, match="failed midway") as caught:
        await sink.write(make_rows(np.arange(200, 300)))  # its second
    assert not isinstance(caught.value, SinkUnavailable)
    assert "Connection reset by peer" in str(caught.value)
    with pytest.raises(SinkError, match="failed midway"):  # the file cannot be finished
        await sink.commit()
    monkeypatch.undo()
    check_snapshot(_snap(_dataset(root)), range(100))
    await sink.close()

    again = await sinks()
    check_snapshot(_snap(_dataset(root)), range(100))
    assert not _tmp_files(root)
    assert _states(root) == ["committed"]
    assert await again.write(make_rows(np.arange(300))) == 200
    await again.commit()
    check_snapshot(_snap(_dataset(root)), range(300))


async def test_uncommitted_bytes_grow_with_writes_and_are_zero_after_commit(
    sinks: Sinks,
) -> None:
    sink = await sinks(target_file_bytes=64 * KIB)
    assert sink.uncommitted_bytes() == 0
    await sink.write(make_rows(np.arange(10)))  # held for the next row group
    one = sink.uncommitted_bytes()
    assert one > 0
    await sink.write(make_rows(np.arange(10, 20)))
    two = sink.uncommitted_bytes()
    assert two > one
    await sink.write(make_rows(np.arange(20, 200)))  # streamed out: the file is rolled
    assert sink.uncommitted_bytes() >= sink.target_file_bytes  # closed files count by size
    await sink.commit()
    assert sink.uncommitted_bytes() == 0
    assert await sink.write(make_rows(np.arange(200))) == 0
    assert sink.uncommitted_bytes() == 0  # nothing new is staged


# --- known defects (see each reason) ----------------------------------------------------------


async def test_a_store_failure_opening_a_file_at_the_commit_is_retried(
    sinks: Sinks, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await sinks()  # 100 rows stay under a row group: the file is opened at the commit
    await sink.write(make_rows(np.arange(100)))

    def slow_down(*args: Any, **kwargs: Any) -> None:
        raise OSError("AWS Error SLOW_DOWN during CreateMultipartUpload: Please reduce your rate")

    monkeypatch.setattr(DatasetFiles, "open_output", slow_down)
    try:
        with pytest.raises(SinkUnavailable, match="SLOW_DOWN"):
            await sink.commit()
    finally:
        monkeypatch.undo()
    await sink.commit()  # the retry, once the store is back
    check_snapshot(_snap(_dataset(root)), range(100))


def _fail_streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row group streamed out fails (the store went away mid-upload)."""

    def fail(writer: pq.ParquetWriter, table: pa.Table, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error (test)")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", fail)


def _fail_closing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a file's footer fails (or completing its upload)."""

    def fail(writer: pq.ParquetWriter) -> None:
        raise OSError(errno.EIO, "Input/output error (test)")

    monkeypatch.setattr(pq.ParquetWriter, "close", fail)


@pytest.mark.parametrize("fault", [_fail_streaming, _fail_closing], ids=["row-group", "footer"])
async def test_a_file_failed_midway_is_never_committed_without_its_rows(
    sinks: Sinks,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[pytest.MonkeyPatch], None],
) -> None:
    """Once a data file failed midway, no commit of that sink may succeed (a reopen drops the
    file, and the messages of its rows, never acked, are delivered again)."""
    sink = await sinks(target_file_bytes=64 * KIB)
    await sink.write(make_rows(np.arange(100)))  # a file rolled, waiting for the commit
    fault(monkeypatch)
    with pytest.raises(SinkError, match="failed midway"):
        await sink.write(make_rows(np.arange(100, 300)))  # the next file fails
    monkeypatch.undo()
    for _ in range(2):  # however often retried
        with pytest.raises(SinkError, match="failed midway"):
            await sink.commit()


async def test_a_commit_retried_after_the_index_failed_past_the_rename_goes_through(
    sinks: Sinks, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await sinks()
    await sink.write(make_rows(np.arange(100)))

    def locked(index: KeyIndex, file_id: int) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(KeyIndex, "commit", locked)
    try:
        with pytest.raises(SinkUnavailable, match="database is locked"):
            await sink.commit()
    finally:
        monkeypatch.undo()
    await sink.commit()
    check_snapshot(_snap(_dataset(root)), range(100))
    assert _states(root) == ["committed"]


def test_row_groups_are_a_64th_of_the_budget_within_bounds() -> None:
    mib = 1024 * KIB
    assert row_group_bytes_for(16 * mib) == 256 * KIB
    assert row_group_bytes_for(64 * mib) == mib
    assert row_group_bytes_for(128 * mib) == 2 * mib
    assert row_group_bytes_for(1024 * mib) == 4 * mib
    assert held_bytes(mib) == 6 * mib  # two open files, three row groups' worth each


async def test_the_sink_sizes_its_row_groups_to_the_budget(sinks: Sinks, root: Path) -> None:
    """What an open file holds between writes follows the budget: with a 16 MiB budget a
    1.6 MiB file is written in row groups of 256 KiB, without one in a single group."""
    sink = await sinks()
    for start in range(0, 1_000, 100):
        await sink.write(make_rows(np.arange(start, start + 100)))
    await sink.commit()
    [whole] = _data_files(root)
    assert pq.ParquetFile(whole).metadata.num_row_groups == 1
    assert sink.fit_buffers(16 * 1024 * KIB) == held_bytes(256 * KIB)
    for start in range(1_000, 2_000, 100):
        await sink.write(make_rows(np.arange(start, start + 100)))
    await sink.commit()
    [small] = [f for f in _data_files(root) if f != whole]
    assert pq.ParquetFile(small).metadata.num_row_groups >= 5
