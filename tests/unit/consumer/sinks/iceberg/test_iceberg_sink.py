"""IcebergSink on pyiceberg's SQL catalog (SQLite) and a local warehouse: rows become part of
the table at commit, exactly once across replicas (the key ledger), through lost races and
commits of unknown outcome; dead-lettered chunks; an existing table that does not fit; large
files rolled at ``target_file_bytes``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy.exc as sa_exc
from prometheus_client import CollectorRegistry
from pyiceberg.table import Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.transforms import DayTransform

from rowbatch.consumer.sinks import rolling
from rowbatch.consumer.sinks.base import (
    ColumnSpec,
    ResultRows,
    SinkUnavailable,
    TableMismatch,
    TableSpec,
)
from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog
from rowbatch.consumer.sinks.iceberg.schema import PARTITION_NAME
from rowbatch.consumer.sinks.iceberg.sink import COMMIT_ID_PROPERTY, IcebergSink

IDENT = "ns.results"
DIM = 4
DAY = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
ROLLED = 3000
"""Rows of a write big enough to be streamed out at once (about 250 KiB of Arrow data)."""

SPEC = TableSpec(
    "results",
    passthrough=(
        ColumnSpec("id", "int64"),
        ColumnSpec("u", "uint8"),
        ColumnSpec("name", "object"),
    ),
    outputs=(ColumnSpec("score", "float32", DIM), ColumnSpec("label", "int32")),
)

Factory = Callable[[], LedgerCatalog]


def result_rows(
    chunk: str,
    start: int,
    n: int,
    *,
    at: datetime = DAY,
    null_names: tuple[int, ...] = (),
    rows: list[int] | None = None,
) -> ResultRows:
    """Rows ``start .. start + n - 1`` of ``chunk`` (or the row indexes ``rows``), each value a
    function of its row index (see :func:`expected`); ``name`` is null at ``null_names``."""
    index = np.array(rows if rows is not None else range(start, start + n), dtype=np.int64)
    count = len(index)
    names = np.array([f"{chunk}-{i}" for i in index.tolist()], dtype=object)
    nulls = np.isin(index, np.array(null_names, dtype=np.int64))
    return ResultRows(
        chunk_id=np.array([chunk] * count, dtype=object),
        row_index=index,
        source_message_id=np.array([f"m-{chunk}"] * count, dtype=object),
        passthrough={
            "id": index * 7 - 3,
            "u": (index * 37 % 256).astype(np.uint8),
            "name": names,
        },
        outputs={
            "score": (index[:, None] + np.arange(DIM) / 4).astype(np.float32),
            "label": (index % 3).astype(np.int32),
        },
        nulls={"name": nulls} if null_names else {},
        model_name="model",
        model_version="7",
        processed_at=at,
    )


def expected(chunk: str, row: int, *, null_name: bool = False) -> dict[str, Any]:
    return {
        "chunk_id": chunk,
        "row_index": row,
        "source_message_id": f"m-{chunk}",
        "id": row * 7 - 3,
        "u": row * 37 % 256,
        "name": None if null_name else f"{chunk}-{row}",
        "score": [float(row + k / 4) for k in range(DIM)],
        "label": row % 3,
        "model_name": "model",
        "model_version": "7",
    }


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[Factory]:
    """Catalogs on one SQLite file and warehouse: each call is another replica's catalog.
    Every one is closed again at the end (a table loaded from a closed catalog reconnects)."""
    made: list[LedgerCatalog] = []

    def make() -> LedgerCatalog:
        catalog = LedgerCatalog(
            "rb", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh"
        )
        made.append(catalog)
        return catalog

    yield make
    for catalog in made:
        catalog.close()


@pytest.fixture
async def sinks(factory: Factory) -> AsyncIterator[Callable[..., IcebergSink]]:
    """Makes sinks on ``factory``'s catalog and closes them at the end."""
    made: list[IcebergSink] = []

    def make(**kw: Any) -> IcebergSink:
        sink = IcebergSink(factory, namespace="ns", **kw)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        await sink.close()


async def opened(make: Callable[..., IcebergSink], **kw: Any) -> IcebergSink:
    sink = make(**kw)
    await sink.open(SPEC)
    return sink


def load(factory: Factory) -> Table:
    catalog = factory()
    try:
        return catalog.load_table(IDENT)
    finally:
        catalog.close()


def scan(factory: Factory) -> pa.Table:
    catalog = factory()
    try:
        return catalog.load_table(IDENT).scan().to_arrow()
    finally:
        catalog.close()


def keys(table: pa.Table) -> list[tuple[str, int]]:
    return sorted(zip(table["chunk_id"].to_pylist(), table["row_index"].to_pylist(), strict=True))


def span(chunk: str, start: int, end: int) -> list[tuple[str, int]]:
    return [(chunk, i) for i in range(start, end)]


def ledger_holds(factory: Factory, chunk: str, start: int, end: int) -> list[tuple[int, int]]:
    catalog = factory()
    try:
        return catalog.claimed(f"{catalog.name}.{IDENT}", {chunk: [(start, end)]}).get(chunk, [])
    finally:
        catalog.close()


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


def no_retry_wait(factory: Factory) -> None:
    """pyiceberg waits before retrying a lost commit; not in unit tests."""
    table = load(factory)
    with table.transaction() as tx:
        tx.set_properties({"commit.retry.min-wait-ms": "0", "commit.retry.max-wait-ms": "0"})


# --- write, commit, read ------------------------------------------------------------------------


async def test_committed_rows_read_back_once_with_their_values(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    assert await sink.write(result_rows("c1", 0, 6, null_names=(2,))) == 6
    assert await sink.write(result_rows("c2", 0, 3)) == 3
    assert await sink.write(result_rows("c1", 6, 4)) == 4
    await sink.commit()

    table = scan(factory)
    assert keys(table) == span("c1", 0, 10) + span("c2", 0, 3)
    got = sorted(table.to_pylist(), key=lambda r: (r["chunk_id"], r["row_index"]))
    want = [expected("c1", i, null_name=i == 2) for i in range(10)]
    want += [expected("c2", i) for i in range(3)]
    for row, wanted in zip(got, want, strict=True):
        assert row["processed_at"] == DAY
        assert {k: row[k] for k in wanted} == wanted
    # uint8 is stored widened (Iceberg has no unsigned types); 255 fits
    assert pa.types.is_int32(table.schema.field("u").type)
    assert max(table["u"].to_pylist()) >= 200


async def test_the_table_is_partitioned_by_the_day_of_processed_at(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    late = datetime(2024, 5, 1, 23, 59, 59, tzinfo=UTC)
    early = datetime(2024, 5, 2, 0, 0, 1, tzinfo=UTC)
    await sink.write(result_rows("c1", 0, 3, at=late))
    await sink.write(result_rows("c2", 0, 2, at=early))
    await sink.commit()

    table = load(factory)
    (field,) = table.spec().fields
    assert field.name == PARTITION_NAME
    assert isinstance(field.transform, DayTransform)
    assert table.schema().find_field(field.source_id).name == "processed_at"
    files = table.inspect.files().to_pylist()
    by_day = {f["partition"][PARTITION_NAME].isoformat(): f["record_count"] for f in files}
    assert by_day == {"2024-05-01": 3, "2024-05-02": 2}
    for f in files:
        assert f"{PARTITION_NAME}={f['partition'][PARTITION_NAME].isoformat()}/" in f["file_path"]


async def test_rows_are_not_visible_before_the_commit(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    assert scan(factory).num_rows == 0
    assert ledger_holds(factory, "c1", 0, 5) == []
    await sink.commit()
    assert scan(factory).num_rows == 5
    assert ledger_holds(factory, "c1", 0, 5) == [(0, 5)]


async def test_each_commit_names_itself_in_the_snapshot_and_an_empty_commit_makes_none(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    registry = CollectorRegistry()
    sink = await opened(sinks, registry=registry)
    await sink.commit()  # nothing staged
    assert load(factory).snapshots() == []
    await sink.write(result_rows("c1", 0, 5))
    await sink.commit()
    await sink.commit()  # nothing new
    (snapshot,) = load(factory).snapshots()
    assert snapshot.summary is not None
    assert len(snapshot.summary.additional_properties[COMMIT_ID_PROPERTY]) == 32
    assert sample(registry, "rowbatch_iceberg_commits_total") == 1
    assert sample(registry, "rowbatch_iceberg_rows_committed_total") == 5


# --- two replicas -------------------------------------------------------------------------------


async def test_a_write_of_rows_committed_already_writes_nothing(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    first = await opened(sinks)
    registry = CollectorRegistry()
    second = await opened(sinks, registry=registry)
    await first.write(result_rows("c1", 0, 10))
    await first.commit()

    assert await second.write(result_rows("c1", 0, 10)) == 0
    assert second.uncommitted_bytes() == 0
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 10
    # partly committed: only the new rows are staged
    assert await second.write(result_rows("c1", 8, 4)) == 2
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 12
    await second.commit()
    assert keys(scan(factory)) == span("c1", 0, 12)


async def test_rows_staged_already_are_not_written_again_before_the_commit(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    registry = CollectorRegistry()
    sink = await opened(sinks, registry=registry)
    assert await sink.write(result_rows("c1", 0, 10)) == 10
    assert await sink.write(result_rows("c1", 0, 10)) == 0  # redelivered before the commit
    assert await sink.write(result_rows("c1", 8, 4)) == 2
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 12
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 12)


async def test_a_key_repeated_in_one_write_is_stored_once(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    assert await sink.write(result_rows("c1", 0, 5, rows=[0, 1, 1, 2, 0])) == 3
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 3)


async def test_overlap_found_at_commit_is_dropped_from_the_later_commit(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    first = await opened(sinks)
    registry = CollectorRegistry()
    second = await opened(sinks, registry=registry)
    # both staged before either commits: the write-time check cannot see the overlap
    assert await first.write(result_rows("c1", 0, 10)) == 10
    assert await first.write(result_rows("c2", 0, 4)) == 4
    assert await second.write(result_rows("c1", 5, 10)) == 10
    assert await second.write(result_rows("c3", 0, 3)) == 3
    await first.commit()
    await second.commit()

    table = scan(factory)
    assert keys(table) == span("c1", 0, 15) + span("c2", 0, 4) + span("c3", 0, 3)
    got = {(r["chunk_id"], r["row_index"]): r for r in table.to_pylist()}
    assert all(got[("c1", i)]["name"] == f"c1-{i}" for i in range(15))
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 5
    assert sample(registry, "rowbatch_iceberg_rows_committed_total") == 8
    # the second's file was written again without the 5 rows
    assert sorted(load(factory).inspect.files()["record_count"].to_pylist()) == [8, 14]
    assert second.uncommitted_bytes() == 0
    assert ledger_holds(factory, "c1", 0, 15) == [(0, 15)]


async def test_a_commit_whose_rows_are_all_taken_adds_no_snapshot(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    first = await opened(sinks)
    registry = CollectorRegistry()
    second = await opened(sinks, registry=registry)
    await first.write(result_rows("c1", 0, 10))
    await second.write(result_rows("c1", 2, 5, rows=[2, 4, 6, 8, 9]))
    await first.commit()
    await second.commit()

    assert keys(scan(factory)) == span("c1", 0, 10)
    assert len(load(factory).snapshots()) == 1
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 5
    assert sample(registry, "rowbatch_iceberg_commits_total") == 0


def race_with(
    monkeypatch: pytest.MonkeyPatch, other: IcebergSink, loop: asyncio.AbstractEventLoop
) -> list[int]:
    """The next ledger commit, once staged, loses its compare-and-set: ``other`` commits first
    (on the test's loop, while the commit's thread waits)."""
    real = LedgerCatalog._update_and_stage_table
    fired: list[int] = []

    def racing(self: LedgerCatalog, *args: Any, **kwargs: Any) -> Any:
        staged = real(self, *args, **kwargs)
        if not fired:
            fired.append(1)
            asyncio.run_coroutine_threadsafe(other.commit(), loop).result(timeout=60)
        return staged

    monkeypatch.setattr(LedgerCatalog, "_update_and_stage_table", racing)
    return fired


async def test_a_commit_that_loses_the_race_is_retried_and_counted(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    first = await opened(sinks, registry=registry)
    other_registry = CollectorRegistry()
    other = await opened(sinks, registry=other_registry)
    no_retry_wait(factory)
    await first.write(result_rows("c1", 0, 10))
    await other.write(result_rows("c2", 0, 5))
    fired = race_with(monkeypatch, other, asyncio.get_running_loop())

    await first.commit()

    assert fired == [1]
    assert sample(registry, "rowbatch_iceberg_commit_conflicts_total") == 1
    assert sample(other_registry, "rowbatch_iceberg_commit_conflicts_total") == 0
    assert keys(scan(factory)) == span("c1", 0, 10) + span("c2", 0, 5)
    assert sample(registry, "rowbatch_iceberg_commits_total") == 1
    assert ledger_holds(factory, "c1", 0, 10) == [(0, 10)]
    assert ledger_holds(factory, "c2", 0, 5) == [(0, 5)]
    assert first.uncommitted_bytes() == 0


async def test_a_lost_race_against_overlapping_rows_drops_them_on_the_retry(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    first = await opened(sinks, registry=registry)
    other = await opened(sinks)
    no_retry_wait(factory)
    await first.write(result_rows("c1", 0, 10))
    await other.write(result_rows("c1", 6, 8))
    race_with(monkeypatch, other, asyncio.get_running_loop())

    await first.commit()

    assert keys(scan(factory)) == span("c1", 0, 14)
    assert sample(registry, "rowbatch_iceberg_commit_conflicts_total") == 1
    assert sample(registry, "rowbatch_iceberg_rows_already_committed_total") == 4
    assert sample(registry, "rowbatch_iceberg_rows_committed_total") == 6


async def test_a_race_lost_more_often_than_retries_allow_is_unavailable_then_retried(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    first = await opened(sinks, registry=registry)
    other = await opened(sinks)
    table = load(factory)
    with table.transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "0"})
    await first.write(result_rows("c1", 0, 10))
    await other.write(result_rows("c2", 0, 5))
    race_with(monkeypatch, other, asyncio.get_running_loop())

    with pytest.raises(SinkUnavailable, match="CommitFailedException"):
        await first.commit()
    assert keys(scan(factory)) == span("c2", 0, 5)
    assert sample(registry, "rowbatch_iceberg_commit_conflicts_total") == 1

    await first.commit()  # the pipeline's retry
    assert keys(scan(factory)) == span("c1", 0, 10) + span("c2", 0, 5)
    assert sample(registry, "rowbatch_iceberg_commits_total") == 1


# --- a commit of unknown outcome ----------------------------------------------------------------


def lost_outcome(monkeypatch: pytest.MonkeyPatch, *, lands: bool) -> list[int]:
    """The next ledger commit raises a connection error after it landed (``lands``) or before
    it reached the database; returns a record of the commits tried."""
    real = LedgerCatalog.commit_table
    calls: list[int] = []

    def flaky(
        self: LedgerCatalog,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return real(self, table, requirements, updates)
        if lands:
            real(self, table, requirements, updates)
        raise sa_exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(LedgerCatalog, "commit_table", flaky)
    return calls


async def test_a_commit_that_landed_before_its_outcome_was_lost_is_not_made_twice(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = CollectorRegistry()
    sink = await opened(sinks, registry=registry)
    await sink.write(result_rows("c1", 0, 10))
    calls = lost_outcome(monkeypatch, lands=True)

    with pytest.raises(SinkUnavailable, match="OperationalError"):
        await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 10)  # it landed

    await sink.commit()  # the pipeline's retry
    assert calls == [1]  # found landed: no second commit
    assert keys(scan(factory)) == span("c1", 0, 10)
    assert len(load(factory).snapshots()) == 1
    assert sink.uncommitted_bytes() == 0
    await sink.commit()
    assert len(load(factory).snapshots()) == 1


async def test_a_commit_that_did_not_land_is_made_by_the_retry(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 10))
    calls = lost_outcome(monkeypatch, lands=False)

    with pytest.raises(SinkUnavailable):
        await sink.commit()
    assert scan(factory).num_rows == 0

    await sink.commit()
    assert calls == [1, 1]
    assert keys(scan(factory)) == span("c1", 0, 10)
    assert len(load(factory).snapshots()) == 1


async def test_rows_written_after_a_commit_of_unknown_outcome_are_committed_by_the_retry(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 10))
    lost_outcome(monkeypatch, lands=True)
    with pytest.raises(SinkUnavailable):
        await sink.commit()

    await sink.write(result_rows("c2", 0, 5))  # staged while the commit is being retried
    await sink.commit()  # returns: every row written before it should be in the table
    assert keys(scan(factory)) == span("c1", 0, 10) + span("c2", 0, 5)


# --- dead-lettered chunks -----------------------------------------------------------------------


async def test_a_staged_chunk_deleted_never_reaches_the_table(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.write(result_rows("c2", 0, 5))
    await sink.write(result_rows("c3", 0, 2))
    await sink.delete_chunks(["c2"])
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5) + span("c3", 0, 2)


async def test_a_staged_chunk_deleted_from_a_rolled_file_never_reaches_the_table(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks, target_file_bytes=1)  # every write closes its file
    await sink.write(result_rows("c1", 0, 5))
    await sink.write(result_rows("c2", 0, 5))
    await sink.write(result_rows("c3", 0, 2, rows=[0, 1]))
    await sink.delete_chunks(["c2", "c3"])
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5)
    assert ledger_holds(factory, "c2", 0, 5) == []
    assert ledger_holds(factory, "c3", 0, 2) == []
    assert len(load(factory).inspect.files()) == 1


async def test_a_staged_chunk_deleted_from_row_groups_written_out_never_reaches_the_table(
    factory: Factory, sinks: Callable[..., IcebergSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rolling, "ROW_GROUP_BYTES", 1)  # each write is streamed out at once
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.write(result_rows("c2", 0, 5))
    await sink.write(result_rows("c3", 0, 2))
    await sink.delete_chunks(["c2"])
    await sink.write(result_rows("c4", 0, 2))
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5) + span("c3", 0, 2) + span("c4", 0, 2)
    assert ledger_holds(factory, "c2", 0, 5) == []
    assert ledger_holds(factory, "c1", 0, 5) == [(0, 5)]


async def test_a_staged_chunk_deleted_leaves_no_ledger_claim(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.write(result_rows("c2", 0, 5))
    await sink.delete_chunks(["c2"])
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5)
    assert ledger_holds(factory, "c2", 0, 5) == []
    assert await sink.write(result_rows("c2", 0, 5)) == 5  # a replay is accepted


async def test_a_committed_chunk_deleted_leaves_the_table_and_the_ledger(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.commit()
    await sink.write(result_rows("c2", 0, 5))  # a file of its own: deleted whole
    await sink.commit()

    await sink.delete_chunks(["c2"])
    assert keys(scan(factory)) == span("c1", 0, 5)
    assert ledger_holds(factory, "c2", 0, 5) == []
    assert ledger_holds(factory, "c1", 0, 5) == [(0, 5)]

    # the chunk written again after a commit (a replay of the dead letter) is accepted
    await sink.commit()
    assert await sink.write(result_rows("c2", 0, 5)) == 5
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5) + span("c2", 0, 5)


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "staged"])
async def test_a_chunk_written_again_after_its_delete_is_committed(
    factory: Factory, sinks: Callable[..., IcebergSink], committed: bool
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.commit()
    await sink.write(result_rows("c2", 0, 5))
    if committed:
        await sink.commit()
    await sink.delete_chunks(["c2"])

    assert await sink.write(result_rows("c2", 0, 5)) == 5
    await sink.commit()  # returns: every row written before it should be in the table
    assert keys(scan(factory)) == span("c1", 0, 5) + span("c2", 0, 5)


async def test_a_committed_chunk_sharing_a_file_is_deleted_from_it(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.write(result_rows("c2", 0, 5))  # the same data file as c1's rows
    await sink.commit()

    await sink.delete_chunks(["c2"])
    assert keys(scan(factory)) == span("c1", 0, 5)
    assert ledger_holds(factory, "c2", 0, 5) == []
    assert ledger_holds(factory, "c1", 0, 5) == [(0, 5)]
    await sink.commit()
    assert await sink.write(result_rows("c2", 0, 5)) == 5
    await sink.commit()
    assert keys(scan(factory)) == span("c1", 0, 5) + span("c2", 0, 5)


async def test_deleting_chunks_never_written_changes_nothing(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    await sink.write(result_rows("c1", 0, 5))
    await sink.commit()
    await sink.delete_chunks(["nope"])
    await sink.delete_chunks([])
    assert keys(scan(factory)) == span("c1", 0, 5)
    assert len(load(factory).snapshots()) == 1


# --- an existing table --------------------------------------------------------------------------


async def test_an_existing_table_with_another_column_type_is_refused(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    await opened(sinks)  # creates the table
    other = TableSpec(
        SPEC.name,
        passthrough=(ColumnSpec("id", "int64"), ColumnSpec("u", "float64"), SPEC.passthrough[2]),
        outputs=SPEC.outputs,
    )
    sink = sinks()
    with pytest.raises(TableMismatch, match="'u'") as caught:
        await sink.open(other)
    assert caught.value.column == "u"
    assert "double" in str(caught.value)


async def test_an_existing_table_lacking_a_column_is_refused(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    await opened(sinks)
    wider = TableSpec(SPEC.name, SPEC.passthrough, (*SPEC.outputs, ColumnSpec("extra", "int64")))
    sink = sinks()
    with pytest.raises(TableMismatch) as caught:
        await sink.open(wider)
    assert caught.value.column == "extra"


async def test_an_existing_table_that_fits_is_opened_again(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    first = await opened(sinks)
    await first.write(result_rows("c1", 0, 3))
    await first.commit()
    again = await opened(sinks)
    await again.write(result_rows("c1", 3, 2))
    await again.commit()
    assert keys(scan(factory)) == span("c1", 0, 5)


# --- staged bytes, large files ------------------------------------------------------------------


async def test_uncommitted_bytes_grow_with_writes_and_are_zero_after_commit(
    sinks: Callable[..., IcebergSink],
) -> None:
    sink = await opened(sinks)
    assert sink.uncommitted_bytes() == 0
    await sink.write(result_rows("c1", 0, 100))
    one = sink.uncommitted_bytes()
    assert one > 0
    await sink.write(result_rows("c2", 0, 100))
    assert sink.uncommitted_bytes() > one
    await sink.commit()
    assert sink.uncommitted_bytes() == 0


async def test_a_file_is_rolled_at_target_file_bytes(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    registry = CollectorRegistry()
    sink = await opened(sinks, target_file_bytes=1, registry=registry)
    for i in range(3):  # each write is a row group of its own (over 64 KiB) and fills a file
        await sink.write(result_rows(f"c{i}", 0, ROLLED))
        assert sink.uncommitted_bytes() > 0  # closed files count by their size
    await sink.commit()

    table = load(factory)
    data = table.inspect.files()
    assert data.num_rows == 3
    assert data["record_count"].to_pylist() == [ROLLED] * 3
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["added-data-files"] == "3"
    assert sample(registry, "rowbatch_iceberg_files_total") == 3
    assert scan(factory).num_rows == 3 * ROLLED


async def test_a_file_below_target_file_bytes_stays_open_across_writes(
    factory: Factory, sinks: Callable[..., IcebergSink]
) -> None:
    sink = await opened(sinks)
    for i in range(3):
        await sink.write(result_rows(f"c{i}", 0, 50))
    await sink.commit()
    assert load(factory).inspect.files().num_rows == 1
