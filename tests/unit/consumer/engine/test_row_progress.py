"""The engine with a source that keeps progress per row (``KeepsRowProgress``): a delivery's
``row_offset`` moves its rows' keys in the chunk; ``rows_written`` is told every range a sink
write stored (parts of a message as each write lands) before the ack of the messages they
complete, and, with a sink that stages its writes (``CommitsWrites``), only after the commit
that holds them; a dead-lettered message's written rows are kept (not deleted) for such a
source, and deleted for any other."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.sinks.base import CommitsWrites, ResultRows
from rowbatch.consumer.sources.base import KeepsRowProgress, WrittenRows
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.chunks.encode import encode_chunk
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    Rejected,
    RunBatch,
    double,
    make,
    message,
)
from tests.unit.consumer.engine.test_pipeline_writer import FlakySink

Event = tuple[str, Any]
"""What happened, in order: ``("write", keys)`` (the sink stored rows), ``("commit", None)``,
``("rows", ranges)`` (``rows_written`` told), ``("ack", message_id)``."""

Key = tuple[str, int]
"""A result row's key: ``(chunk_id, row_index)``."""


class ProgressSource(FakeSource):
    """A ``FakeSource`` that keeps progress per row: ``rows_written`` calls and acks go into
    one log, in order."""

    def __init__(self, deliveries: Sequence[Delivery], log: list[Event] | None = None) -> None:
        super().__init__(deliveries)
        self.log: list[Event] = [] if log is None else log
        self.told: list[WrittenRows] = []

    async def rows_written(self, written: Sequence[WrittenRows]) -> None:
        self.told += written
        self.log.append(("rows", [(d.message_id, start, stop) for d, start, stop in written]))

    async def ack(self, delivery: Delivery) -> None:
        await super().ack(delivery)
        self.log.append(("ack", delivery.message_id))


class LoggingSink(FakeSink):
    """A ``FakeSink`` that logs the keys of each write; ``wrote`` is set by the first."""

    def __init__(self, log: list[Event]) -> None:
        super().__init__()
        self.log = log
        self.wrote = asyncio.Event()

    async def write(self, rows: ResultRows) -> int:
        stored = await super().write(rows)
        keys = [(str(c), int(i)) for c, i in zip(rows.chunk_id, rows.row_index, strict=True)]
        self.log.append(("write", keys))
        self.wrote.set()
        return stored


class CommittingSink(LoggingSink):
    """A ``CommitsWrites`` sink: rows written are staged, part of the table at ``commit``."""

    def __init__(self, log: list[Event], target_file_bytes: int = 1 << 40) -> None:
        super().__init__(log)
        self.target_file_bytes = target_file_bytes
        self.staged: list[Key] = []
        self.committed: set[Key] = set()

    async def write(self, rows: ResultRows) -> int:
        stored = await super().write(rows)
        self.staged += self.log[-1][1]
        return stored

    async def commit(self) -> None:
        self.committed.update(self.staged)
        self.staged = []
        self.log.append(("commit", None))

    def uncommitted_bytes(self) -> int:
        return 8 * len(self.staged)


def part(chunk: str, values: list[float], row_offset: int) -> Delivery:
    """Rows ``[row_offset, row_offset + len(values))`` of chunk ``chunk`` as one message (a
    table-mode part of a chunk), with its own message id."""
    enc = encode_chunk("t", {"x": np.array(values, np.float64)}, "json", chunk)
    return Delivery.of_rows(
        message_id=f"{chunk}@{row_offset}",
        payload=enc.payload,
        attributes=enc.attributes,
        publish_time=0.0,
        delivery_attempt=1,
        source="table",
        size=len(enc.payload),
        row_offset=row_offset,
    )


def build(
    source: FakeSource,
    sink: FakeSink,
    run: RunBatch = double,
    *,
    target: int = 4,
    in_flight: int = 2,
    writers: int = 2,
    max_write_rows: int = 0,
) -> Pipeline:
    """Like ``test_pipeline.make``, with the write settings open (``max_write_rows`` of one
    batch: a write per batch)."""
    return make_pipeline(
        source,
        sink,
        FnModel(run, poison=Rejected),
        target_batch_size=target,
        max_wait_s=0.0,
        max_in_flight=in_flight,
        grace_s=5.0,
        write_concurrency=writers,
        max_write_rows=max_write_rows,
    )


async def run_to_end(pipeline: Pipeline) -> None:
    await asyncio.wait_for(pipeline.run(asyncio.Event()), timeout=10)


def keys_of(ranges: Sequence[tuple[str, int, int]], chunks: Mapping[str, Delivery]) -> list[Key]:
    """The result keys of message ranges ``(message_id, start, stop)`` (``chunks``: each
    message's delivery by id; a broker message ``m<i>`` holds chunk ``chunk-<i>``)."""
    out = []
    for mid, start, stop in ranges:
        delivery = chunks[mid]
        chunk = f"chunk-{mid[1:]}" if mid.startswith("m") else mid.split("@")[0]
        out += [(chunk, delivery.row_offset + r) for r in range(start, stop)]
    return out


def told_rows(source: ProgressSource) -> dict[str, list[int]]:
    """Each message's rows ``rows_written`` was told, sorted (a row told twice: twice)."""
    out: dict[str, list[int]] = {}
    for delivery, start, stop in source.told:
        out.setdefault(delivery.message_id, []).extend(range(start, stop))
    return {mid: sorted(rows) for mid, rows in out.items()}


def told_before(log: Sequence[Event], index: int, message_id: str) -> set[int]:
    """The rows of ``message_id`` that ``rows_written`` was told before ``log[index]``."""
    return {
        row
        for kind, what in log[:index]
        if kind == "rows"
        for mid, start, stop in what
        if mid == message_id
        for row in range(start, stop)
    }


def check_every_ack_follows_its_rows(log: Sequence[Event], rows: Mapping[str, int]) -> None:
    """Each ack in ``log`` comes after ``rows_written`` was told every row of its message."""
    acks = 0
    for index, (kind, what) in enumerate(log):
        if kind == "ack":
            acks += 1
            assert told_before(log, index, what) == set(range(rows[what])), (what, log)
    assert acks == len(rows)


def test_the_fakes_are_what_the_engine_tells_apart() -> None:
    assert isinstance(ProgressSource([]), KeepsRowProgress)
    assert not isinstance(FakeSource([]), KeepsRowProgress)
    assert isinstance(CommittingSink([]), CommitsWrites)
    assert not isinstance(LoggingSink([]), CommitsWrites)


def test_a_delivery_s_row_offset_is_0_unless_given() -> None:
    assert message(0, [1.0]).row_offset == 0
    assert part("chunk-7", [1.0], 0).row_offset == 0
    assert part("chunk-7", [1.0], 300).row_offset == 300


# --- row_offset ---------------------------------------------------------------------------------


async def test_row_offset_moves_the_row_indexes_and_rows_written_counts_in_the_message() -> None:
    head, tail = part("chunk-7", [1.0, 2.0], 0), part("chunk-7", [3.0, 4.0, 5.0], 300)
    broker = message(1, [6.0, 7.0])  # a whole chunk: offset 0
    source = ProgressSource([head, tail, broker])
    sink = FakeSink()
    await run_to_end(make(source, sink))

    assert sink.rows == {
        ("chunk-7", 0): 2.0,
        ("chunk-7", 1): 4.0,
        ("chunk-7", 300): 6.0,
        ("chunk-7", 301): 8.0,
        ("chunk-7", 302): 10.0,
        ("chunk-1", 0): 12.0,
        ("chunk-1", 1): 14.0,
    }
    assert sorted(source.acked) == ["chunk-7@0", "chunk-7@300", "m1"]
    # rows_written counts inside the message (its rows 0..n), whatever its offset; a message
    # over two batches may be told in two ranges
    assert told_rows(source) == {"chunk-7@0": [0, 1], "chunk-7@300": [0, 1, 2], "m1": [0, 1]}
    yielded = {d.message_id: d for d in (head, tail, broker)}
    assert all(d is yielded[d.message_id] for d, _, _ in source.told)


async def test_row_offset_holds_for_a_message_split_across_writes() -> None:
    # 6 rows at offset 10, a write per batch of 4: rows 10..13, then 14..15
    source, sink = ProgressSource([part("c", [float(r) for r in range(6)], 10)]), FakeSink()
    await run_to_end(build(source, sink, in_flight=1, writers=1, max_write_rows=4))
    assert sink.rows == {("c", 10 + r): 2.0 * r for r in range(6)}
    assert [(start, stop) for _, start, stop in source.told] == [(0, 4), (4, 6)]
    assert source.acked == ["c@10"]


# --- rows_written, then the ack -----------------------------------------------------------------


async def test_rows_written_is_told_every_written_range_before_the_acks_it_allows() -> None:
    log: list[Event] = []
    rows = {f"m{i}": 1 + i % 6 for i in range(12)}
    deliveries = [message(i, [float(10 * i + r) for r in range(rows[f"m{i}"])]) for i in range(12)]
    source = ProgressSource(deliveries, log)
    await run_to_end(make(source, LoggingSink(log)))

    assert sorted(source.acked) == sorted(rows)
    check_every_ack_follows_its_rows(log, rows)
    # every row written is told, once, and nothing else
    by_id = {d.message_id: d for d in deliveries}
    written = [k for kind, keys in log if kind == "write" for k in keys]
    told = [k for kind, ranges in log if kind == "rows" for k in keys_of(ranges, by_id)]
    assert sorted(told) == sorted(written)
    assert len(written) == sum(rows.values())


async def test_a_message_over_several_writes_is_told_as_each_lands_and_acked_once_whole() -> None:
    log: list[Event] = []
    source = ProgressSource([message(0, [float(r) for r in range(10)])], log)
    sink = LoggingSink(log)
    await run_to_end(build(source, sink, in_flight=1, writers=1, max_write_rows=4))

    assert log == [
        ("write", [("chunk-0", r) for r in range(4)]),
        ("rows", [("m0", 0, 4)]),
        ("write", [("chunk-0", r) for r in range(4, 8)]),
        ("rows", [("m0", 4, 8)]),
        ("write", [("chunk-0", 8), ("chunk-0", 9)]),
        ("rows", [("m0", 8, 10)]),
        ("ack", "m0"),
    ]
    assert len(sink.rows) == 10


async def test_a_plain_source_is_not_told_and_rows_keep_their_message_indexes() -> None:
    # The same split message from a source without rows_written: written and acked as before.
    source, sink = FakeSource([message(0, [float(r) for r in range(10)])]), FakeSink()
    await run_to_end(build(source, sink, in_flight=1, writers=1, max_write_rows=4))
    assert source.acked == ["m0"]
    assert sink.rows == {("chunk-0", r): 2.0 * r for r in range(10)}


async def test_rows_the_sink_rejects_are_not_told() -> None:
    # m1's output (666) is refused by the sink: its part of the write is dead-lettered, m0's
    # part is written and told.
    source = ProgressSource([message(0, [1.0, 2.0]), message(1, [333.0])])
    sink = FlakySink(bad=666.0)
    await run_to_end(make(source, sink))
    assert [(mid, r.reason_class.value) for mid, r in source.dead] == [("m1", "rejected-by-sink")]
    assert source.acked == ["m0"]
    assert told_rows(source) == {"m0": [0, 1]}
    assert source.log == [("rows", [("m0", 0, 2)]), ("ack", "m0")]


async def test_a_rejected_part_of_a_message_with_rows_still_to_write_is_not_told() -> None:
    # m1's first batch (rows 0..3) holds a value the sink refuses; its row 4, in the next
    # write, is stored: only that row is told, and m1 is dead-lettered once it is resolved
    # (its stored row kept: the source keeps progress per row).
    source = ProgressSource([message(1, [333.0, 1.0, 2.0, 3.0, 4.0])])
    sink = FlakySink(bad=666.0)
    await run_to_end(build(source, sink, in_flight=1, writers=1, max_write_rows=4))
    assert [(mid, r.reason_class.value) for mid, r in source.dead] == [("m1", "rejected-by-sink")]
    assert told_rows(source) == {"m1": [4]}
    assert sink.rows == {("chunk-1", 4): 8.0}
    assert sink.deleted == []


async def test_a_write_that_stores_nothing_tells_nothing() -> None:
    source, sink = ProgressSource([message(1, [333.0])]), FlakySink(bad=666.0)
    await run_to_end(make(source, sink))
    assert [mid for mid, _ in source.dead] == ["m1"]
    assert source.log == []  # rows_written never called, not even with no rows


# --- dead letters -------------------------------------------------------------------------------


def rejected_after_the_first_write(sink: LoggingSink) -> RunBatch:
    """``double``, but a batch holding a negative value is rejected (poison), only once the
    sink has written something (so the bad message has rows written when it is dead-lettered)."""

    async def run(batch: Batch) -> Mapping[str, NDArray[Any]]:
        if (np.asarray(batch.columns["x"]) < 0).any():
            await sink.wrote.wait()
            raise Rejected("negative value")
        return await double(batch)

    return run


@pytest.mark.parametrize("keeps_progress", [True, False], ids=["row-progress", "plain"])
async def test_a_dead_lettered_message_s_written_rows_are_deleted_only_without_row_progress(
    keeps_progress: bool,
) -> None:
    # m1's first 4 rows fill a batch (written); its last row, with m2's, is rejected.
    log: list[Event] = []
    deliveries = [message(1, [1.0, 2.0, 3.0, 4.0, -1.0]), message(2, [7.0])]
    source = ProgressSource(deliveries, log) if keeps_progress else FakeSource(deliveries)
    sink = LoggingSink(log)
    await run_to_end(make(source, sink, rejected_after_the_first_write(sink)))

    assert [mid for mid, _ in source.dead] == ["m1"]
    assert source.dead[0][1].reason_class.value == "rejected-by-model"
    assert source.acked == ["m2"]
    assert ("write", [("chunk-1", r) for r in range(4)]) in log  # written before the failure
    if keeps_progress:
        assert sink.deleted == []
        assert sink.rows == {
            ("chunk-1", 0): 2.0,
            ("chunk-1", 1): 4.0,
            ("chunk-1", 2): 6.0,
            ("chunk-1", 3): 8.0,
            ("chunk-2", 0): 14.0,
        }
        assert isinstance(source, ProgressSource)
        assert told_rows(source) == {"m1": [0, 1, 2, 3], "m2": [0]}
    else:
        assert sink.deleted == ["chunk-1"]
        assert sink.rows == {("chunk-2", 0): 14.0}


# --- a sink that commits ------------------------------------------------------------------------


@pytest.mark.parametrize("target_file_bytes", [1 << 40, 1], ids=["commit-at-drain", "often"])
async def test_with_a_committing_sink_rows_are_told_after_their_commit_before_the_ack(
    target_file_bytes: int,
) -> None:
    log: list[Event] = []
    rows = {f"m{i}": 1 + i % 6 for i in range(12)}
    deliveries = [message(i, [float(10 * i + r) for r in range(rows[f"m{i}"])]) for i in range(12)]
    by_id = {d.message_id: d for d in deliveries}
    source = ProgressSource(deliveries, log)
    sink = CommittingSink(log, target_file_bytes)
    await run_to_end(make(source, sink))

    assert sorted(source.acked) == sorted(rows)
    assert sink.committed == set(sink.rows)
    check_every_ack_follows_its_rows(log, rows)
    staged: set[Key] = set()
    committed: set[Key] = set()
    told: list[Key] = []
    for kind, what in log:
        if kind == "write":
            staged.update(what)
        elif kind == "commit":
            committed |= staged
        elif kind == "rows":
            keys = keys_of(what, by_id)
            assert set(keys) <= committed, (what, log)  # told only once committed
            told += keys
    assert sorted(told) == sorted(sink.rows)  # each row told once
    commits = [i for i, (kind, _) in enumerate(log) if kind == "commit"]
    assert commits
    assert all(i > commits[0] for i, (kind, _) in enumerate(log) if kind in ("rows", "ack"))
    if target_file_bytes == 1:
        assert len(commits) > 1


async def test_with_a_committing_sink_a_split_message_is_told_after_the_commit() -> None:
    log: list[Event] = []
    source = ProgressSource([message(0, [float(r) for r in range(10)])], log)
    sink = CommittingSink(log)
    await run_to_end(build(source, sink, in_flight=1, writers=1, max_write_rows=4))

    assert [kind for kind, _ in log] == ["write", "write", "write", "commit", "rows", "ack"]
    assert log[-2] == ("rows", [("m0", 0, 4), ("m0", 4, 8), ("m0", 8, 10)])
    assert sink.committed == {("chunk-0", r) for r in range(10)}
