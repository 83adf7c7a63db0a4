"""``TableSource`` over real local files, without the pipeline: every row of the shard is
delivered once and the deliveries end once all are settled; a rerun on the same state reads
nothing; a dead letter of several rows is bisected (unless its reason holds for every row), of
one row written to the dead-letter file; a nack delivers again; shards split the rows; the
start-up check refuses a first chunk that does not fit and a state of another run."""

from __future__ import annotations

import asyncio
import datetime
import decimal
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from rowbatch.consumer.sources.base import KeepsRowProgress, SourceConfigError
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.table import source as source_module
from rowbatch.consumer.sources.table.checkpoint import RunMismatch
from rowbatch.consumer.sources.table.dead_letters import read_dead_letters
from rowbatch.consumer.sources.table.encode import Encoded, encode_piece
from rowbatch.consumer.sources.table.plan import TableInputError, Unit
from rowbatch.consumer.sources.table.reader import Piece, UnitReader
from rowbatch.consumer.sources.table.settings import JOB_INDEX_VARIABLE, TableSettings
from rowbatch.consumer.sources.table.source import Probe, TableModel, TableSource
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.headers.fields import H_CHUNK_ID
from tests.unit.consumer.sources.table.data import (
    ids_of,
    truncate,
    write_dataset,
    write_parquet,
)

TIMEOUT_S = 10
ROW_LEVEL = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "column 'x': a null", "null_not_allowed")
WHOLE = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "no column 'y'", "missing_column")


@pytest.fixture(autouse=True)
def _no_job_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOB_INDEX_VARIABLE, raising=False)


def table_settings(tmp_path: Path, **fields: object) -> TableSettings:
    values: dict[str, object] = {
        "input": str(tmp_path / "in"),
        "state": str(tmp_path / "state"),
        "chunk_rows": 4,
    }
    return TableSettings.model_validate(values | fields)


def make_source(
    settings: TableSettings,
    *,
    version: str = "1",
    probe: Probe | None = None,
    registry: CollectorRegistry | None = None,
    sleep: Callable[[float], None] | None = None,
    async_sleep: Callable[[float], Awaitable[None]] | None = None,
) -> TableSource:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s")

    async def no_async_sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s")

    return TableSource(
        settings,
        model=TableModel("scorer", version, {"inputs": {"x": "X"}, "passthrough": {"id": "int64"}}),
        columns=["id", "x"],
        probe=probe,
        registry=registry,
        sleep=sleep or no_sleep,
        async_sleep=async_sleep or no_async_sleep,
    )


class Rig:
    """Takes the source's vectors and keeps what it was handed until settled."""

    def __init__(self, source: TableSource) -> None:
        self.source = source
        self.vectors = source.vectors()
        self.held: dict[str, Delivery] = {}
        self.seen: list[Delivery] = []

    async def pull(self) -> list[Delivery]:
        async with asyncio.timeout(TIMEOUT_S):
            vector = list(await anext(self.vectors))
        assert vector, "a vector holds at least one delivery"
        for delivery in vector:
            assert delivery.message_id not in self.held, "one id handed out twice at once"
            self.held[delivery.message_id] = delivery
        self.seen.extend(vector)
        return vector

    async def take(self, message_id: str) -> Delivery:
        while message_id not in self.held:
            await self.pull()
        return self.held.pop(message_id)

    async def drain(self) -> None:
        """Acks what is held and every vector after it, until the deliveries end."""
        if self.held:
            await self.source.ack_many(list(self.held.values()))
            self.held.clear()
        while True:
            try:
                vector = await self.pull()
            except StopAsyncIteration:
                return
            for delivery in vector:
                del self.held[delivery.message_id]
            await self.source.ack_many(vector)

    def ids(self) -> list[int]:
        return [i for d in self.seen for i in ids_of(d)]


async def run_to_end(source: TableSource) -> Rig:
    await source.check()
    rig = Rig(source)
    await rig.drain()
    return rig


def folder_of(tmp_path: Path, name: str = "shard-0-of-1") -> StateFolder:
    return StateFolder(str(tmp_path / "state"), name)


@pytest.fixture
def rows17(tmp_path: Path) -> int:
    """Two files (10 and 7 rows) in row groups of 4, under a hive partition."""
    return write_dataset(
        tmp_path / "in", [("day=1/a.parquet", 10), ("day=2/b.parquet", 7)], row_group_rows=4
    )


# --- a whole run --------------------------------------------------------------------------------


async def test_every_row_is_delivered_once_then_the_deliveries_end(
    tmp_path: Path, rows17: int
) -> None:
    registry = CollectorRegistry()
    source = make_source(table_settings(tmp_path, chunk_rows=3), registry=registry)
    await source.check()
    assert source.counts.planned == rows17
    assert source.counts.skipped == 0
    assert source.state_location == str(tmp_path / "state" / "shard-0-of-1")
    rig = Rig(source)
    await rig.drain()

    assert sorted(rig.ids()) == list(range(rows17))
    assert len(rig.ids()) == rows17, "no row twice"
    ids = [d.message_id for d in rig.seen]
    assert len(set(ids)) == len(ids)
    assert ids[:4] == [f"day=1/a.parquet@{n}" for n in (0, 3, 4, 7)]
    for d in rig.seen:
        assert d.attributes[H_CHUNK_ID] == d.message_id
        assert d.delivery_attempt == 1
        assert d.source == d.message_id.split("@")[0]
        assert d.size > 0
        columns = decode_chunk(d.payload, d.attributes).columns
        assert set(columns) == {"id", "x"}  # only the binding's columns
    assert source.complete
    assert source.counts.written == source.counts.read == rows17
    assert source.counts.settled == rows17
    assert source.counts.dead_lettered == 0
    assert registry.get_sample_value("rowbatch_table_rows_total", {"outcome": "written"}) == 17
    assert registry.get_sample_value("rowbatch_table_rows_planned") == 17
    with pytest.raises(StopAsyncIteration):
        await anext(source.vectors())
    await source.close()


async def test_deliveries_one_at_a_time_end_too(tmp_path: Path, rows17: int) -> None:
    source = make_source(table_settings(tmp_path))
    await source.check()
    ids: list[int] = []
    async with asyncio.timeout(TIMEOUT_S):
        async for delivery in source.deliveries():
            ids.extend(ids_of(delivery))
            await source.ack(delivery)
    assert sorted(ids) == list(range(rows17))
    assert source.complete


async def test_a_run_stopped_after_its_last_row_was_settled_is_complete(
    tmp_path: Path, rows17: int
) -> None:
    """A SIGTERM whose drain settles every row, before intake asked for the next vector (and
    met the end), still ends complete; one row not settled leaves it incomplete."""
    for settle_all in (True, False):
        folder = tmp_path / str(settle_all)
        write_dataset(
            folder / "in", [("day=1/a.parquet", 10), ("day=2/b.parquet", 7)], row_group_rows=4
        )
        source = make_source(table_settings(folder, chunk_rows=3))
        await source.check()
        vectors = source.vectors()
        taken: list[Delivery] = []
        async with asyncio.timeout(TIMEOUT_S):
            while sum(len(ids_of(d)) for d in taken) < rows17:
                taken.extend(await anext(vectors))
            await source.ack_many(taken if settle_all else taken[1:])
            while not source._fed_all:  # the reader meets the end of its input
                source._changed.clear()
                await source._changed.wait()
        await source.close()
        assert source.complete is settle_all


async def test_a_second_run_on_the_same_state_reads_nothing(tmp_path: Path, rows17: int) -> None:
    await run_to_end(make_source(table_settings(tmp_path)))
    again = make_source(table_settings(tmp_path))
    await again.check()
    assert again.counts.skipped == rows17
    async with asyncio.timeout(TIMEOUT_S):
        with pytest.raises(StopAsyncIteration):
            await anext(again.vectors())
    assert again.complete
    assert again.counts.read == again.counts.written == 0


async def test_a_rerun_reads_only_what_was_not_settled(tmp_path: Path, rows17: int) -> None:
    first = make_source(table_settings(tmp_path))
    await first.check()
    rig = Rig(first)
    await first.dead_letter(await rig.take("day=1/a.parquet@0"), ROW_LEVEL)
    half = await rig.take("day=1/a.parquet@0")  # rows 0-1; rows 2-3 stay unsettled
    acked = [half, await rig.take("day=1/a.parquet@8")]
    nacked = await rig.take("day=1/a.parquet@4")
    await first.nack(nacked)
    await first.ack_many(acked)
    await first.close()
    assert not first.complete

    second = make_source(table_settings(tmp_path))
    await second.check()
    assert second.counts.skipped == 4  # rows 0-1 and 8-9 of a.parquet
    rerun = Rig(second)
    await rerun.drain()
    assert rerun.seen[0].message_id == "day=1/a.parquet@2"  # the rest of the first chunk
    assert ids_of(rerun.seen[0]) == [2, 3]
    assert rerun.seen[0].attributes[H_CHUNK_ID] == "day=1/a.parquet@0"  # with its keys
    assert rerun.seen[0].row_offset == 2
    assert sorted(rerun.ids()) == list(range(2, 8)) + list(range(10, rows17))
    assert len(rerun.ids()) == rows17 - 4
    assert second.complete
    assert second.counts.read == second.counts.written == rows17 - 4


async def test_a_progress_write_failing_is_retried_with_backoff(
    tmp_path: Path, rows17: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = StateFolder.write_segment
    failures: list[str] = []

    def flaky(self: StateFolder, prefix: str, lines: Iterable[str]) -> str:
        if prefix == "done" and len(failures) < 2:
            failures.append(prefix)
            raise ConnectionResetError("state store: connection reset")
        return original(self, prefix, lines)

    monkeypatch.setattr(StateFolder, "write_segment", flaky)
    slept: list[float] = []

    async def record_sleep(seconds: float) -> None:
        slept.append(seconds)

    source = make_source(table_settings(tmp_path), async_sleep=record_sleep)
    rig = await run_to_end(source)
    assert slept == [1.0, 2.0]
    assert source.complete
    assert source.counts.written == rows17
    assert sorted(rig.ids()) == list(range(rows17))
    again = make_source(table_settings(tmp_path))
    await again.check()
    assert again.counts.skipped == rows17, "every range was recorded in the end"


async def test_an_empty_shard_ends_at_once(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 4)], 2)  # two units
    source = make_source(table_settings(tmp_path, shard=3, shards=4))
    await source.check()
    assert source.counts.planned == 0
    with pytest.raises(StopAsyncIteration):
        await anext(source.vectors())
    assert source.complete


# --- settling -----------------------------------------------------------------------------------


async def test_a_row_level_dead_letter_bisects_until_the_bad_row_is_alone(
    tmp_path: Path,
) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path))
    await source.check()
    rig = Rig(source)

    whole = await rig.take("a.parquet@0")
    await source.dead_letter(whole, ROW_LEVEL)
    assert source.counts.dead_lettered == 0
    left, right = await rig.take("a.parquet@0"), await rig.take("a.parquet@2")
    assert (ids_of(left), ids_of(right)) == ([0, 1], [2, 3])
    # Both halves keep the chunk's keys: its id, and their place in it.
    assert left.attributes[H_CHUNK_ID] == right.attributes[H_CHUNK_ID] == "a.parquet@0"
    assert (left.row_offset, right.row_offset) == (0, 2)
    assert left.delivery_attempt == right.delivery_attempt == 1
    await source.ack(left)

    await source.dead_letter(right, ROW_LEVEL)
    two, three = await rig.take("a.parquet@2"), await rig.take("a.parquet@3")
    assert (ids_of(two), ids_of(three)) == ([2], [3])
    await source.dead_letter(three, ROW_LEVEL)
    assert source.counts.dead_lettered == 1
    [record] = read_dead_letters(folder_of(tmp_path))
    assert record["chunk_id"] == "a.parquet@0"
    assert (record["file"], record["file_row"], record["row_index"]) == ("a.parquet", 3, 3)
    assert record["code"] == "null_not_allowed"
    assert record["reason"] == "schema-mismatch"
    assert record["row"]["id"] == 3

    await source.ack(two)
    await rig.drain()
    assert source.complete
    assert source.counts.written == 7
    acked = [d for d in rig.seen if d not in (whole, right, three)]
    written = [i for d in acked for i in ids_of(d)]
    assert sorted(written) == [0, 1, 2, 4, 5, 6, 7], "each row once; the bad row not again"

    rerun = make_source(table_settings(tmp_path))
    await rerun.check()
    assert rerun.counts.skipped == 8  # the dead-lettered row is settled too


async def test_a_one_row_dead_letter_is_written_and_settled(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 3)], 3)
    source = make_source(table_settings(tmp_path, chunk_rows=1))
    await source.check()
    rig = Rig(source)
    await source.dead_letter(await rig.take("a.parquet@1"), ROW_LEVEL)
    assert source.counts.dead_lettered == 1
    assert [r["file_row"] for r in read_dead_letters(folder_of(tmp_path))] == [1]
    await rig.drain()
    assert source.complete
    assert source.counts.written == 2
    assert sorted(rig.ids()) == [0, 1, 2]  # row 1 was not delivered again


async def test_a_dead_letter_that_holds_for_every_row_is_not_bisected(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path))
    await source.check()
    rig = Rig(source)
    await source.dead_letter(await rig.take("a.parquet@0"), WHOLE)
    assert source.counts.dead_lettered == 4
    records = read_dead_letters(folder_of(tmp_path))
    assert [(r["chunk_id"], r["row_index"], r["file_row"]) for r in records] == [
        ("a.parquet@0", i, i) for i in range(4)
    ]
    assert {r["code"] for r in records} == {"missing_column"}
    await rig.drain()
    assert source.complete
    assert source.counts.written == 4
    assert sorted(rig.ids()) == list(range(8)), "rows 0-3 were not delivered again"


async def test_a_nack_delivers_the_chunk_again(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path))
    await source.check()
    rig = Rig(source)
    first = await rig.take("a.parquet@4")
    await source.nack(first)
    second = await rig.take("a.parquet@4")
    assert second is not first
    assert second.delivery_attempt == 2
    assert second.payload == first.payload
    assert second.attributes == first.attributes
    await source.nack(second)
    third = await rig.take("a.parquet@4")
    assert third.delivery_attempt == 3
    await source.ack(third)
    await rig.drain()
    assert source.complete
    assert source.counts.written == 8


async def test_a_bad_value_found_while_reading_is_dead_lettered_at_once(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    vectors = ["[1, 2]", "[3, 4]", "[5, 6, 7]", "[8, 9]", "[1, 1]"]
    (root / "rows.jsonl").write_text(
        "".join(f'{{"id": {i}, "x": {v}}}\n' for i, v in enumerate(vectors))
    )
    settings = table_settings(tmp_path, schema="x:vector[float32,2]")
    source = make_source(settings)
    await source.check()
    assert source.counts.planned is None  # not known for a text file
    rig = Rig(source)
    await rig.drain()
    assert source.complete
    assert sorted(rig.ids()) == [0, 1, 3, 4]
    assert (source.counts.read, source.counts.written, source.counts.dead_lettered) == (5, 4, 1)
    [record] = read_dead_letters(folder_of(tmp_path))
    assert (record["file"], record["file_row"], record["reason"]) == (
        "rows.jsonl",
        2,
        "undecodable",
    )
    assert record["row"]["x"] == [5.0, 6.0, 7.0]


async def test_bad_csv_lines_are_dead_lettered_one_by_one_and_a_rerun_reads_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    lines = ["id,x"] + [f'{i},"[{i}, {i}]"' for i in range(10)]
    lines[1 + 2] = '2,"[2, 2]",extra'  # too many fields
    lines[1 + 7] = 'seven,"[7, 7]"'  # not an int64
    (root / "rows.csv").write_text("\n".join(lines) + "\n")
    settings = table_settings(tmp_path, schema="id:int64,x:vector[float32,2]")
    source = make_source(settings)
    rig = await run_to_end(source)
    assert source.complete
    assert sorted(rig.ids()) == [0, 1, 3, 4, 5, 6, 8, 9]
    assert (source.counts.read, source.counts.written, source.counts.dead_lettered) == (10, 8, 2)
    extra, wrong = read_dead_letters(folder_of(tmp_path))
    assert (extra["file_row"], extra["line"], extra["chunk_id"]) == (2, 4, "rows.csv@0")
    assert extra["text"] == '2,"[2, 2]",extra'
    assert extra["message"] == "line 4: expected 2 fields, found 3"
    assert (extra["reason"], extra["code"]) == ("undecodable", "malformed_line")
    assert (wrong["file_row"], wrong["line"], wrong["row_index"]) == (7, 9, 3)
    assert wrong["message"] == "line 9, column 'id': cannot convert 'seven' to int64"
    again = make_source(settings)
    rig = await run_to_end(again)
    assert again.complete and rig.ids() == []
    assert again.counts.skipped == 10


# --- shards -------------------------------------------------------------------------------------


async def test_two_shards_deliver_disjoint_rows_covering_every_row(tmp_path: Path) -> None:
    rows = write_dataset(tmp_path / "in", [("a.parquet", 9), ("b.parquet", 5), ("c.parquet", 6)], 3)
    delivered: list[set[int]] = []
    for shard in (0, 1):
        source = make_source(table_settings(tmp_path, shard=shard, shards=2, chunk_rows=2))
        rig = await run_to_end(source)
        assert source.complete
        assert len(rig.ids()) == len(set(rig.ids()))
        assert source.counts.written == source.counts.planned == len(rig.ids())
        delivered.append(set(rig.ids()))
    assert delivered[0].isdisjoint(delivered[1])
    assert delivered[0] | delivered[1] == set(range(rows))
    assert delivered[0] and delivered[1]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [
        "run",  # the layout the shards share
        "shard-0-of-2",
        "shard-1-of-2",
    ]


async def test_a_file_added_between_two_shards_starts_is_refused_unless_a_new_run(
    tmp_path: Path,
) -> None:
    """Shard 0 finishes; a file lands; shard 1 would now own other row groups (some of them
    shard 0's, never to be read): refused, naming the file. Every shard over with --new-run
    reads the new layout."""
    write_dataset(tmp_path / "in", [("a.parquet", 9), ("b.parquet", 5)], 3)
    await run_to_end(make_source(table_settings(tmp_path, shard=0, shards=2)))
    write_parquet(tmp_path / "in" / "0.parquet", 100, 6, row_group_rows=3)  # sorts first
    late = make_source(table_settings(tmp_path, shard=1, shards=2))
    with pytest.raises(SourceConfigError, match=r"1 file\(s\) added: 0\.parquet.*--new-run"):
        await late.check()
    delivered: set[int] = set()
    for shard in (0, 1):
        source = make_source(table_settings(tmp_path, shard=shard, shards=2, new_run=True))
        delivered |= set((await run_to_end(source)).ids())
        assert source.complete
    assert delivered == set(range(14)) | set(range(100, 106))


async def test_one_shard_reads_a_file_added_since_its_last_run(tmp_path: Path, rows17: int) -> None:
    """With one shard nothing moves between shards: a rerun reads only the new file."""
    await run_to_end(make_source(table_settings(tmp_path)))
    write_parquet(tmp_path / "in" / "day=3" / "c.parquet", 100, 5, row_group_rows=3)
    again = make_source(table_settings(tmp_path))
    rerun = await run_to_end(again)
    assert again.complete
    assert sorted(rerun.ids()) == list(range(100, 105))


async def test_the_shard_comes_from_the_job_index(
    tmp_path: Path, rows17: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JOB_INDEX_VARIABLE, "1")
    source = make_source(table_settings(tmp_path, shards=2))
    await run_to_end(source)
    assert source.state_location.endswith("shard-1-of-2")


async def test_several_shards_without_a_shard_is_a_config_error(
    tmp_path: Path, rows17: int
) -> None:
    source = make_source(table_settings(tmp_path, shards=2))
    with pytest.raises(SourceConfigError, match="no shard is given"):
        await source.check()


# --- start-up check -----------------------------------------------------------------------------


async def test_a_first_chunk_that_does_not_fit_the_binding_is_refused(
    tmp_path: Path, rows17: int
) -> None:
    probed: list[Delivery] = []

    def probe(delivery: Delivery) -> DeadLetterReason | None:
        probed.append(delivery)
        return WHOLE

    source = make_source(table_settings(tmp_path), probe=probe)
    with pytest.raises(SourceConfigError) as caught:
        await source.check()
    assert "day=1/a.parquet does not fit the binding: no column 'y'" in str(caught.value)
    [delivery] = probed
    assert delivery.message_id == "day=1/a.parquet@0"
    assert ids_of(delivery) == [0, 1, 2, 3]


async def test_a_first_chunk_with_a_row_level_problem_passes(tmp_path: Path, rows17: int) -> None:
    probed: list[str] = []

    def probe(delivery: Delivery) -> DeadLetterReason | None:
        probed.append(delivery.message_id)
        return ROW_LEVEL

    source = make_source(table_settings(tmp_path), probe=probe)
    rig = await run_to_end(source)  # the probed chunk is not left held: the run ends
    assert probed == ["day=1/a.parquet@0"]
    assert source.complete
    assert sorted(rig.ids()) == list(range(rows17))


async def test_a_missing_input_is_a_config_error(tmp_path: Path) -> None:
    source = make_source(table_settings(tmp_path))
    with pytest.raises(SourceConfigError, match="no such file or directory"):
        await source.check()


async def test_another_model_version_is_refused_unless_a_new_run(
    tmp_path: Path, rows17: int
) -> None:
    first = make_source(table_settings(tmp_path))
    await first.check()
    rig = Rig(first)
    await first.ack(await rig.take("day=1/a.parquet@0"))
    await first.close()

    other = make_source(table_settings(tmp_path), version="2")
    with pytest.raises(SourceConfigError) as caught:
        await other.check()
    assert isinstance(caught.value.__cause__, RunMismatch)
    assert "model_version: '1' then, '2' now" in str(caught.value)

    fresh = make_source(table_settings(tmp_path, new_run=True), version="2")
    await fresh.check()
    assert fresh.counts.skipped == 0
    rerun = Rig(fresh)
    await rerun.drain()
    assert sorted(rerun.ids()) == list(range(rows17))


# --- read failures ------------------------------------------------------------------------------


async def test_a_read_failing_on_the_store_is_retried_from_where_it_stopped(
    tmp_path: Path, rows17: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = UnitReader.pieces
    failed: list[int] = []

    def flaky(self: UnitReader, unit: Unit) -> Iterator[Piece]:
        for piece in original(self, unit):
            yield piece
            if unit.index == 1 and piece.first_row not in failed and len(failed) < 2:
                failed.append(piece.first_row)
                raise TableInputError("store: connection reset") from ConnectionResetError()

    monkeypatch.setattr(UnitReader, "pieces", flaky)
    slept: list[float] = []
    source = make_source(table_settings(tmp_path, chunk_rows=2), sleep=slept.append)
    rig = await run_to_end(source)
    assert failed == [4, 6]  # row group 1 of a.parquet: after its first, then its second piece
    assert slept == [1.0, 1.0]  # the wait starts over once a piece was read
    assert sorted(rig.ids()) == list(range(rows17))
    assert len(rig.ids()) == rows17
    assert source.complete


async def test_a_corrupt_row_group_is_skipped_with_a_dead_letter_record_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """pyarrow reports a corrupt Parquet page as an OSError, like a store that is down: the
    store still finds the file, so after CONTENT_ATTEMPTS reads the rest of the row group is
    unreadable (one dead-letter record with its rows, the run not complete) and every other
    row group is read; it used to be retried every minute for ever."""
    path = tmp_path / "in" / "big.parquet"
    write_parquet(path, 0, 8_000, row_group_rows=2_000)
    data = bytearray(path.read_bytes())
    page = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset  # its ids
    data[page : page + 64] = bytes(b ^ 0x5A for b in data[page : page + 64])
    path.write_bytes(bytes(data))
    slept: list[float] = []
    source = make_source(table_settings(tmp_path, chunk_rows=500), sleep=slept.append)
    rig = await run_to_end(source)
    assert not source.complete
    [what] = source.counts.unreadable
    assert "big.parquet" in what
    [record] = read_dead_letters(folder_of(tmp_path))
    assert record["code"] == "unreadable_input" and record["reason"] == "undecodable"
    assert (record["file_row"], record["rows"]) == (2_000, 2_000)  # row group 1, no piece read
    lost = range(2_000, 4_000)
    assert sorted(rig.ids()) == [i for i in range(8_000) if i not in lost]
    assert slept == [1.0, 2.0]  # CONTENT_ATTEMPTS reads, backing off between them


async def test_a_parquet_file_that_cannot_be_opened_is_unreadable_and_a_rerun_reads_it_mended(
    tmp_path: Path,
) -> None:
    """Truncated to 60 % (no footer): the plan does not refuse the input; the start-up check
    passes it by; at its turn the file is one dead-letter record (its rows unknown) and the
    run, every other row written, ends not complete, without waiting (its content is at
    fault, not the store). Mended, the rerun reads its rows (the old record does not stop it)."""
    total = write_dataset(
        tmp_path / "in", [("a.parquet", 5), ("b.parquet", 7), ("c.parquet", 6)], 3
    )
    good = truncate(tmp_path / "in" / "a.parquet")  # sorts first: the start-up check's unit
    probed: list[str] = []

    def probe(delivery: Delivery) -> DeadLetterReason | None:
        probed.append(delivery.message_id)
        return None

    source = make_source(table_settings(tmp_path), probe=probe)
    rig = await run_to_end(source)
    assert probed == ["b.parquet@0"]
    assert not source.complete
    assert sorted(rig.ids()) == list(range(5, total))
    assert len(rig.ids()) == total - 5
    assert source.counts.planned is None
    [what] = source.counts.unreadable
    assert what.startswith("a.parquet rows 0 to its end: ")
    assert "a.parquet: cannot read it as Parquet: " in what
    [record] = read_dead_letters(folder_of(tmp_path))
    assert (record["file"], record["file_row"], record["rows"]) == ("a.parquet", 0, None)
    assert record["code"] == "unreadable_input" and record["reason"] == "undecodable"
    assert "cannot read it as Parquet" in record["message"]

    (tmp_path / "in" / "a.parquet").write_bytes(good)
    again = make_source(table_settings(tmp_path))
    rerun = await run_to_end(again)
    assert again.complete and not again.counts.unreadable
    assert sorted(rerun.ids()) == list(range(5))
    assert again.counts.planned == total and again.counts.skipped == total - 5


async def test_two_shards_read_a_mended_file_once_without_refusing_or_moving_units(
    tmp_path: Path,
) -> None:
    """With two shards, b.parquet not opened when the layout was recorded is one unit (shard
    0's); mended, its two row groups would shift c.parquet's units between the shards. The
    rerun of both shards keeps the recorded layout: shard 0 reads b.parquet whole, nothing
    else is read again, every row once."""
    layout = [("a.parquet", 4), ("b.parquet", 4), ("c.parquet", 6)]
    total = write_dataset(tmp_path / "in", layout, 2)
    good = truncate(tmp_path / "in" / "b.parquet")
    delivered: list[int] = []
    for shard in (0, 1):
        source = make_source(table_settings(tmp_path, shard=shard, shards=2))
        delivered += (await run_to_end(source)).ids()
        assert source.complete is (shard == 1)
    assert sorted(delivered) == [i for i in range(total) if i not in range(4, 8)]
    (tmp_path / "in" / "b.parquet").write_bytes(good)
    for shard in (0, 1):
        source = make_source(table_settings(tmp_path, shard=shard, shards=2))
        ids = (await run_to_end(source)).ids()
        assert source.complete
        assert sorted(ids) == (list(range(4, 8)) if shard == 0 else [])
        delivered += ids
    assert sorted(delivered) == list(range(total))


async def test_a_text_file_that_stops_parsing_keeps_its_rows_before_and_a_rerun_reads_the_rest(
    tmp_path: Path, rows17: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = UnitReader.pieces

    def bad_format(self: UnitReader, unit: Unit) -> Iterator[Piece]:
        for piece in original(self, unit):
            yield piece
            if unit.index == 1:
                raise TableInputError("a.parquet: cannot read it: parse error") from ValueError()

    monkeypatch.setattr(UnitReader, "pieces", bad_format)
    source = make_source(table_settings(tmp_path, chunk_rows=2))
    rig = await run_to_end(source)
    assert not source.complete
    assert source.counts.unreadable == [
        "day=1/a.parquet rows 6-7: a.parquet: cannot read it: parse error"
    ]
    assert sorted(rig.ids()) == [i for i in range(rows17) if i not in (6, 7)]
    monkeypatch.setattr(UnitReader, "pieces", original)
    again = make_source(table_settings(tmp_path, chunk_rows=2))
    rerun = await run_to_end(again)
    assert again.complete
    assert sorted(rerun.ids()) == [6, 7]


async def test_a_store_that_does_not_answer_is_waited_for_past_the_content_attempts(
    tmp_path: Path, rows17: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = UnitReader.pieces
    failures = iter(range(source_module.CONTENT_ATTEMPTS + 3))

    def store_down(self: UnitReader, unit: Unit) -> Iterator[Piece]:
        if unit.index == 1 and next(failures, None) is not None:
            raise TableInputError("store: unreachable") from ConnectionRefusedError()
        yield from original(self, unit)

    monkeypatch.setattr(UnitReader, "pieces", store_down)
    monkeypatch.setattr(UnitReader, "store_answers", lambda self, unit: False)
    slept: list[float] = []
    source = make_source(table_settings(tmp_path), sleep=slept.append)
    rig = await run_to_end(source)
    assert source.complete and not source.counts.unreadable
    assert sorted(rig.ids()) == list(range(rows17))
    assert slept == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


async def test_a_file_gone_is_not_retried_and_ends_the_deliveries(
    tmp_path: Path, rows17: int
) -> None:
    source = make_source(table_settings(tmp_path))
    await source.check()
    (tmp_path / "in" / "day=1" / "a.parquet").unlink()
    with pytest.raises(TableInputError, match=r"a\.parquet"):
        async with asyncio.timeout(TIMEOUT_S):
            await anext(source.vectors())
    await source.close()


# --- known problems -----------------------------------------------------------------------------


async def test_a_column_no_row_can_convert_is_refused_at_start_up(tmp_path: Path) -> None:
    n = 8
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "x": pa.array([datetime.datetime(2024, 1, 1)] * n, pa.timestamp("us")),
        }
    )
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    probed: list[Delivery] = []

    def probe(delivery: Delivery) -> DeadLetterReason | None:
        probed.append(delivery)
        return None

    source = make_source(table_settings(tmp_path), probe=probe)
    try:
        with pytest.raises(SourceConfigError, match="'x'"):
            await source.check()
    finally:
        await source.close()


async def test_an_input_without_any_column_read_is_refused_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"other": list(range(8))}), tmp_path / "in" / "a.parquet")
    source = make_source(table_settings(tmp_path), probe=lambda delivery: WHOLE)
    try:
        with pytest.raises(SourceConfigError):
            await source.check()
    finally:
        await source.close()


async def test_a_new_run_forgets_the_old_runs_dead_letters(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 3)], 3)
    first = make_source(table_settings(tmp_path, chunk_rows=1))
    await first.check()
    rig = Rig(first)
    await first.dead_letter(await rig.take("a.parquet@1"), WHOLE)
    await rig.drain()
    assert [r["file_row"] for r in read_dead_letters(folder_of(tmp_path))] == [1]

    fresh = make_source(table_settings(tmp_path, chunk_rows=1, new_run=True), version="2")
    rerun = await run_to_end(fresh)
    assert sorted(rerun.ids()) == [0, 1, 2]
    assert fresh.counts.written == 3
    assert fresh.counts.dead_lettered == 0
    assert read_dead_letters(folder_of(tmp_path)) == []


async def test_a_decimal_column_does_not_crash_the_run(tmp_path: Path) -> None:
    n = 4
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "x": pa.array([decimal.Decimal("1.50")] * n, pa.decimal128(5, 2)),
        }
    )
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    source = make_source(table_settings(tmp_path), probe=lambda delivery: None)
    try:
        try:
            await source.check()
        except SourceConfigError:
            return  # refused at start-up: fine too
        await Rig(source).drain()
        assert source.complete
        assert source.counts.dead_lettered == n
    finally:
        await source.close()


async def test_a_dead_letter_that_fails_leaves_the_chunk_to_a_nack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine nacks a delivery whose dead letter raised: the chunk is still held, so it
    comes back whole, and nothing of it was settled."""
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path))
    await source.check()
    rig = Rig(source)
    first = await rig.take("a.parquet@0")

    def broken(piece: Piece, table: str, schema: Mapping[str, ColumnType]) -> Encoded:
        if piece.rows < first_rows:  # the dead letter's halves, not the reader's chunks
            raise RuntimeError("encoder bug")
        return encode_piece(piece, table, schema)

    first_rows = int(first.attributes["rowbatch-row-count"])
    monkeypatch.setattr(source_module, "encode_piece", broken)
    reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, "bad row", "invalid_argument")
    with pytest.raises(RuntimeError, match="encoder bug"):
        await source.dead_letter(first, reason)
    monkeypatch.undo()
    await source.nack(first)
    again = await rig.take("a.parquet@0")
    assert again.delivery_attempt == 2 and again.payload == first.payload
    await source.ack(again)
    await rig.drain()
    assert source.complete and source.counts.written == 8 and source.counts.dead_lettered == 0


# --- progress per row (KeepsRowProgress) --------------------------------------------------------


def segments_of(source: TableSource) -> int:
    """How many progress segments the source's checkpoint holds (one per record)."""
    assert source._checkpoint is not None
    return source._checkpoint.segments


async def test_rows_written_of_a_chunk_not_yet_complete_are_not_read_again(
    tmp_path: Path,
) -> None:
    """A kill after some rows of a chunk were written: the rerun reads only the others, as
    parts that keep the chunk's keys (its id, and their row indexes in it)."""
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    first = make_source(table_settings(tmp_path, chunk_rows=8))
    assert isinstance(first, KeepsRowProgress)
    await first.check()
    rig = Rig(first)
    whole = await rig.take("a.parquet@0")
    await first.rows_written([(whole, 0, 3), (whole, 5, 6)])
    await first.close()  # killed: never acked
    assert not first.complete

    second = make_source(table_settings(tmp_path, chunk_rows=8))
    await second.check()
    assert second.counts.skipped == 4
    rerun = Rig(second)
    three = await rerun.take("a.parquet@3")
    six = await rerun.take("a.parquet@6")
    assert (ids_of(three), ids_of(six)) == ([3, 4], [6, 7])
    assert three.attributes[H_CHUNK_ID] == six.attributes[H_CHUNK_ID] == "a.parquet@0"
    assert (three.row_offset, six.row_offset) == (3, 6)
    await second.nack(three)  # a part delivered again keeps its place in the chunk
    again = await rerun.take("a.parquet@3")
    assert (again.row_offset, again.delivery_attempt) == (3, 2)
    await second.ack_many([again, six])
    await rerun.drain()
    assert second.complete
    assert second.counts.written == 4
    assert sorted(rerun.ids()) == [3, 3, 4, 4, 6, 7]  # rows 3-4 twice: the nack


async def test_an_ack_of_rows_all_recorded_already_records_nothing_more(
    tmp_path: Path, rows17: int
) -> None:
    source = make_source(table_settings(tmp_path))
    await source.check()
    rig = Rig(source)
    chunk = await rig.take("day=1/a.parquet@0")
    before = segments_of(source)
    await source.rows_written([(chunk, 0, 2)])
    await source.rows_written([(chunk, 2, 4)])
    assert segments_of(source) == before + 2
    await source.ack(chunk)
    assert segments_of(source) == before + 2, "the ack's rows were all recorded"
    assert source.counts.written == 4
    other = await rig.take("day=1/a.parquet@4")
    await source.rows_written([(other, 0, 1)])
    await source.ack(other)  # rows 1-3 never told: the ack records the chunk
    assert segments_of(source) == before + 4
    await rig.drain()
    rerun = make_source(table_settings(tmp_path))
    await rerun.check()
    assert rerun.counts.skipped == rows17


async def test_a_dead_letter_after_some_rows_were_written_sends_round_only_the_rest(
    tmp_path: Path,
) -> None:
    """The rows written stay written (the engine deletes none of them); the halves carry
    the rows left, with the chunk's keys, and the run counts every row once."""
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path, chunk_rows=8))
    await source.check()
    rig = Rig(source)
    whole = await rig.take("a.parquet@0")
    await source.rows_written([(whole, 0, 2), (whole, 6, 8)])
    await source.dead_letter(whole, ROW_LEVEL)
    assert source.counts.written == 4  # rows 0-1 and 6-7
    left, right = await rig.take("a.parquet@2"), await rig.take("a.parquet@4")
    assert (ids_of(left), ids_of(right)) == ([2, 3], [4, 5])
    assert (left.row_offset, right.row_offset) == (2, 4)
    assert left.attributes[H_CHUNK_ID] == right.attributes[H_CHUNK_ID] == "a.parquet@0"
    await source.ack(left)
    await source.dead_letter(right, ROW_LEVEL)
    four, five = await rig.take("a.parquet@4"), await rig.take("a.parquet@5")
    await source.ack(four)
    await source.dead_letter(five, ROW_LEVEL)
    await rig.drain()
    assert source.complete
    assert (source.counts.written, source.counts.dead_lettered) == (7, 1)
    [record] = read_dead_letters(folder_of(tmp_path))
    assert (record["chunk_id"], record["row_index"], record["file_row"]) == ("a.parquet@0", 5, 5)
    rerun = make_source(table_settings(tmp_path, chunk_rows=8))
    await rerun.check()
    assert rerun.counts.skipped == 8


async def test_rows_told_after_their_chunk_was_settled_are_recorded_where_they_are(
    tmp_path: Path,
) -> None:
    """A committing sink tells a write's rows after its commit: by then their chunk may be
    dead-lettered and cut in halves (one of which took its id over). The rows are recorded
    at their own file rows all the same."""
    write_dataset(tmp_path / "in", [("a.parquet", 8)], 8)
    source = make_source(table_settings(tmp_path, chunk_rows=8))
    await source.check()
    rig = Rig(source)
    whole = await rig.take("a.parquet@0")
    await source.dead_letter(whole, ROW_LEVEL)
    await source.rows_written([(whole, 1, 3), (whole, 6, 7)])
    await source.close()
    rerun = make_source(table_settings(tmp_path, chunk_rows=8))
    await rerun.check()
    assert rerun.counts.skipped == 3
    again = Rig(rerun)
    await again.drain()
    assert sorted(again.ids()) == [0, 3, 4, 5, 7]
