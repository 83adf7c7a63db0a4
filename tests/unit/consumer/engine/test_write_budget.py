"""What the write side holds is counted in the memory budget: the pipeline sets aside room for
the answers being decoded and for the writers' joined batches and encode buffers; a write
takes its cost from the writers' share (waiting while another write holds it), and a coalesced
write larger than the whole share is split. Also the allocator settings that make RSS follow
the budget, and the ``rowbatch_memory_bytes`` split."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from prometheus_client import generate_latest

from rowbatch.consumer.engine.answered_queue import AnsweredQueue
from rowbatch.consumer.engine.batcher import Batch, Batcher, Segment
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.ledger import Entry, Ledger
from rowbatch.consumer.engine.pipeline import INPUT_ROW_BYTES, PipelineSettings, pipeline_share
from rowbatch.consumer.engine.results import Answered, largest_write_cost, write_cost
from rowbatch.consumer.engine.stage_context import StageContext, Telemetry
from rowbatch.consumer.engine.write_stage import WriteLimits, WriteStage
from rowbatch.consumer.observe import memory
from rowbatch.consumer.observe.costs import WRITE_ROW_OVERHEAD_BYTES
from rowbatch.consumer.observe.memory import MemoryCollector, MemorySplit
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ENCODE_SLICE_BYTES, ResultRows
from rowbatch.consumer.sinks.postgres.sink import slice_rows
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.timing import Clocks
from tests.unit.consumer.engine.factories import pipeline_settings
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, make

DIM = 1024  # 4 KiB of float32 outputs a row


def answered(ledger: Ledger, rows: int, version: str = "") -> Answered:
    """One message of ``rows`` rows, answered in one batch."""
    delivery = Delivery(f"m{len(ledger)}", b"", {}, 0.0, 1, "sub")
    entry = ledger.open(delivery, f"chunk-{len(ledger)}", rows, 0, 0.0)
    batch = Batch(
        columns={"x": np.zeros(rows, np.int64)},
        nulls={},
        segments=(Segment(entry.key, 0, rows),),
        oldest_at=0.0,
    )
    return Answered(batch, {"Y": np.zeros((rows, DIM), np.float32)}, version)


class RecordingWriter:
    """A ``SinkWriter`` stand-in: records each write's parts, each write waiting for
    ``release`` when one is given."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.writes: list[list[int]] = []
        self.release = release
        self.started = asyncio.Event()

    async def write(self, parts: Sequence[Answered]) -> list[Any]:
        self.writes.append([len(p.batch) for p in parts])
        self.started.set()
        if self.release is not None:
            await self.release.wait()
        return []


def stage(
    answered_q: AnsweredQueue,
    writer: RecordingWriter,
    ledger: Ledger,
    allowance: ByteBudget | None,
    metrics: Metrics,
) -> WriteStage:
    settled: list[Entry] = []

    async def settle_many(entries: Sequence[Entry]) -> None:
        settled.extend(entries)

    async def fail(*_: Any) -> None:
        raise AssertionError("nothing fails here")

    context = StageContext(
        ledger=ledger,
        batcher=Batcher(100, 1.0, lambda: 0.0),
        budget=ByteBudget(10**12),
        telemetry=Telemetry(metrics),
        clocks=Clocks(monotonic=lambda: 0.0),
        rows_queued=asyncio.Event(),
        rows_taken=asyncio.Event(),
    )
    return WriteStage(
        context,
        settler=cast("Any", SimpleNamespace(fail=fail)),
        answered=answered_q,
        writer=cast("Any", writer),
        limits=WriteLimits(
            max_rows=1_000, max_bytes=64 * 1024 * 1024, output_bytes_per_row=DIM * 4
        ),
        settle_written=settle_many,
        allowance=allowance,
    )


def test_write_cost_counts_the_joined_copy_rows_and_encode_slices() -> None:
    ledger = Ledger()
    one, two = answered(ledger, 10), answered(ledger, 300)
    slices = 2 * ENCODE_SLICE_BYTES
    row = DIM * 4 + 8  # outputs and the x column
    # nothing joined; encode buffers of at most twice the write's values
    assert write_cost([one]) == 10 * WRITE_ROW_OVERHEAD_BYTES + 2 * 10 * row
    joined = (10 + 300) * row  # copied into one batch
    assert write_cost([one, two]) == joined + 310 * WRITE_ROW_OVERHEAD_BYTES + slices
    # the largest coalesced write: up to max_write_bytes of outputs, plus one batch past it
    past = (1 << 20) + 128 * 10_000
    assert largest_write_cost(512, 1 << 20, 128, 10_000) == past + 512 * 256 + slices
    assert largest_write_cost(512, 1 << 20, 128, 1000) == 512_000 + 512 * 256 + 2 * 512_000
    assert largest_write_cost(128, 1 << 20, 128, 10_000) == 128 * 256 + slices  # one batch
    # small rows: the encode buffers are at most twice the write's values
    assert largest_write_cost(1024, 1 << 20, 256, 8) == 8192 + 1024 * 256 + 2 * 8192


async def test_a_coalesced_write_larger_than_the_writers_share_is_split() -> None:
    ledger = Ledger()
    q = AnsweredQueue(1_000_000)
    parts = [answered(ledger, 100) for _ in range(4)]
    for part in parts:
        q.put_nowait(part)
    q.put_nowait(None)
    # room for two parts joined, not three
    allowance = ByteBudget(write_cost(parts[:2]) + 1)
    writer = RecordingWriter()
    await stage(q, writer, ledger, allowance, Metrics()).write()
    assert writer.writes == [[100, 100], [100, 100]]
    assert allowance.used == 0
    assert len(ledger) == 0  # every message written and settled


async def test_a_write_waits_while_another_holds_the_writers_share() -> None:
    ledger = Ledger()
    q = AnsweredQueue(1_000_000)
    release = asyncio.Event()
    writer = RecordingWriter(release)
    allowance = ByteBudget(write_cost([answered(Ledger(), 100)]) + 1)  # one write at a time
    metrics = Metrics()
    s = stage(q, writer, ledger, allowance, metrics)
    writers = [asyncio.create_task(s.write()) for _ in range(2)]
    q.put_nowait(answered(ledger, 100))
    await writer.started.wait()
    q.put_nowait(answered(ledger, 100))
    for _ in range(10):
        await asyncio.sleep(0)
    assert writer.writes == [[100]]  # the second writer took its part and waits for room
    assert metrics.write_bytes._value.get() == allowance.used > 0
    release.set()
    q.put_nowait(None)
    q.put_nowait(None)
    await asyncio.gather(*writers)
    assert writer.writes == [[100], [100]]
    assert allowance.used == 0
    assert metrics.write_bytes._value.get() == 0


def settings(**overrides: Any) -> PipelineSettings:
    base: dict[str, Any] = {
        "target_batch_size": 128,
        "max_wait_s": 0.05,
        "max_in_flight": 4,
        "output_bytes_per_row": 16384,
    }
    return pipeline_settings(**(base | overrides))


def test_the_pipeline_sets_aside_answers_in_flight_and_the_writers_share() -> None:
    s = settings()
    share = pipeline_share(s, 128 * 1024 * 1024)
    assert share.answers == 4 * 128 * 16384  # a second copy of each answer being decoded
    row = 16384 + INPUT_ROW_BYTES
    assert share.writes == 2 * largest_write_cost(512, s.max_write_bytes, 128, row)
    # a small budget: never more than half of it, the writers getting at least half of that
    small = pipeline_share(s, 16 * 1024 * 1024)
    assert small.total <= 8 * 1024 * 1024
    assert small.writes >= 4 * 1024 * 1024


async def test_what_is_set_aside_takes_room_from_messages() -> None:
    budget = ByteBudget(100)
    budget.set_aside(30)
    assert budget.room == 70
    await budget.acquire(60)
    assert not budget.fits(20)  # 60 + 30 + 20 > 100
    assert budget.fits(10)
    budget.set_aside(0)
    assert budget.fits(40)
    with pytest.raises(ValueError, match="half the budget"):
        budget.set_aside(51)


def test_postgres_copy_slices_are_bounded_in_bytes_not_rows() -> None:
    def rows(n: int, dim: int) -> ResultRows:
        return ResultRows(
            chunk_id=np.array(["c"] * n, dtype=object),
            row_index=np.arange(n, dtype=np.int64),
            source_message_id=np.array(["m"] * n, dtype=object),
            passthrough={"id": np.arange(n, dtype=np.int64)},
            outputs={"y": np.zeros((n, dim), np.float32)},
            nulls={},
            model_name="m",
            model_version="1",
            processed_at=datetime.now(UTC),
        )

    wide = slice_rows(rows(128, 4096))  # 16 KiB a row: about 1 MiB of COPY data a slice
    assert 2 * wide * 4096 * 4 <= ENCODE_SLICE_BYTES + 64 * wide
    assert wide >= 1
    assert slice_rows(rows(5000, 1)) == 2000  # narrow rows: the row cap
    assert slice_rows(rows(1, 1 << 20)) == 1  # a row over the slice is a slice of its own


def test_return_freed_memory_fixes_the_mmap_threshold_trim_and_arenas() -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    assert memory.return_freed_memory(mallopt)
    assert calls == [
        (memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD_BYTES),
        (memory.M_TRIM_THRESHOLD, memory.TRIM_THRESHOLD_BYTES),
        (memory.M_ARENA_MAX, memory.ARENA_MAX),
    ]
    assert not memory.return_freed_memory(lambda *_: 0)  # refused: said so


def test_the_memory_split_is_exported_by_part() -> None:
    metrics = Metrics()
    split = MemorySplit(rss=100, malloc_in_use=40, malloc_kept=7, arrow_pool=3, python_traced=-1)
    metrics.registry.register(CollectorStub(split))
    text = generate_latest(metrics.registry).decode()
    assert 'rowbatch_test_memory_bytes{part="malloc_kept"} 7.0' in text
    real = memory.read_split()
    assert real.rss > 0  # this process's, from /proc/self/statm
    assert 'rowbatch_memory_bytes{part="rss"}' in text


class CollectorStub(MemoryCollector):
    """The collector under another name, reading a fixed split."""

    def __init__(self, split: MemorySplit) -> None:
        super().__init__(lambda: split)

    def collect(self) -> Any:
        for family in super().collect():
            family.name = "rowbatch_test_memory_bytes"
            for sample in list(family.samples):
                family.samples.remove(sample)
                family.samples.append(sample._replace(name="rowbatch_test_memory_bytes"))
            yield family


class FileSink(FakeSink):
    """A sink with open files' row groups (``BuffersFiles``): holds ``held`` bytes."""

    def __init__(self, held: int) -> None:
        super().__init__()
        self.held = held
        self.sized_for: list[int] = []

    def fit_buffers(self, budget_bytes: int) -> int:
        self.sized_for.append(budget_bytes)
        return self.held


def test_a_file_sinks_row_groups_are_set_aside_beside_the_pipelines_share() -> None:
    limit = 10_000_000

    def aside(sink: FakeSink) -> int:
        budget = ByteBudget(limit)
        make(FakeSource([]), sink, byte_budget=budget)
        return budget.aside

    plain = aside(FakeSink())
    files = FileSink(held=1_000_000)
    assert aside(files) == plain + 1_000_000
    assert files.sized_for == [limit]  # asked once, with the whole budget
    # Never more than the half of the budget that may be set aside.
    assert aside(FileSink(held=limit)) == limit // 2
