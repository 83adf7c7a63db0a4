"""The engine with fakes behind the Source and Sink protocols: every row written once, poison
isolated and dead-lettered whole, transient trouble pauses intake, shutdown nacks leftovers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.pipeline import Pipeline, PipelineFailed
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer
from rowbatch.consumer.sinks.base import ResultRows, TableSpec
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.chunks.encode import encode_chunk
from tests.unit.consumer.engine.factories import make_pipeline


class Rejected(Exception):
    pass


class FakeSource:
    def __init__(self, deliveries: Sequence[Delivery], *, hold_open: bool = False) -> None:
        self._deliveries = list(deliveries)
        self._hold_open = hold_open
        self.acked: list[str] = []
        self.nacked: list[str] = []
        self.dead: list[tuple[str, DeadLetterReason]] = []
        self.pauses = 0
        self.resumes = 0
        self.paused = asyncio.Event()

    async def check(self) -> None:
        pass

    async def deliveries(self) -> AsyncIterator[Delivery]:
        for d in self._deliveries:
            yield d
        if self._hold_open:
            await asyncio.Event().wait()

    async def ack(self, delivery: Delivery) -> None:
        self.acked.append(delivery.message_id)

    async def nack(self, delivery: Delivery) -> None:
        self.nacked.append(delivery.message_id)

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        self.dead.append((delivery.message_id, reason))

    def pause(self) -> None:
        self.pauses += 1
        self.paused.set()

    def resume(self) -> None:
        self.resumes += 1

    async def close(self) -> None:
        pass


class FakeSink:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], float] = {}
        self.writes = 0
        self.deleted: list[str] = []

    async def open(self, table: TableSpec) -> None:
        pass

    async def write(self, rows: ResultRows) -> int:
        self.writes += 1
        before = len(self.rows)
        for cid, idx, val in zip(rows.chunk_id, rows.row_index, rows.outputs["y"], strict=True):
            self.rows.setdefault((str(cid), int(idx)), float(val))
        return len(self.rows) - before

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self.deleted += chunk_ids
        for key in [k for k in self.rows if k[0] in chunk_ids]:
            del self.rows[key]

    async def close(self) -> None:
        pass


def message(i: int, values: list[float]) -> Delivery:
    enc = encode_chunk("t", {"x": np.array(values, np.float64)}, "json", f"chunk-{i}")
    return Delivery(f"m{i}", enc.payload, enc.attributes, 0.0, 1, "sub")


async def double(batch: Batch) -> Mapping[str, NDArray[Any]]:
    return {"Y": np.asarray(batch.columns["x"]) * 2}


RunBatch = Callable[[Batch], Awaitable[Mapping[str, NDArray[Any]] | Answer]]
"""A fake model's batch function (``FnModel`` makes it a model handler)."""


def poison_if_negative(run: RunBatch) -> RunBatch:
    async def wrapped(batch: Batch) -> Mapping[str, NDArray[Any]] | Answer:
        if (np.asarray(batch.columns["x"]) < 0).any():
            raise Rejected("negative value")
        return await run(batch)

    return wrapped


class FnModel:
    """A model handler around a batch function (the engine's ``ModelHandler`` Protocol):
    ``poison`` / ``fatal`` name the error types it classifies so."""

    def __init__(
        self,
        run: RunBatch,
        *,
        poison: type[BaseException] | tuple[type[BaseException], ...] = (),
        fatal: type[BaseException] | tuple[type[BaseException], ...] = (),
        target_batch_size: int = 4,
        output_bytes_per_row: int = 8,
    ) -> None:
        self._run = run
        self._poison = poison
        self._fatal = fatal
        self.target_batch_size = target_batch_size
        self.output_bytes_per_row = output_bytes_per_row

    def check(self, chunk: DecodedChunk) -> None:
        pass

    async def run(self, batch: BatchRows) -> Answer:
        out = await self._run(batch)  # type: ignore[arg-type]
        return out if isinstance(out, Answer) else Answer(out)

    def is_poison(self, exc: BaseException) -> bool:
        return isinstance(exc, self._poison)

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, self._fatal)


def no_check(chunk: DecodedChunk) -> None:
    pass


def make(
    source: FakeSource,
    sink: FakeSink,
    run: RunBatch = double,
    *,
    target: int = 4,
    budget: int = 10_000_000,
    grace_s: float = 5.0,
    max_wait_s: float = 0.0,
    tracing: PipelineTracer = NO_TRACING,
    byte_budget: ByteBudget | None = None,
) -> Pipeline:
    """A pipeline of ``source`` and ``sink``; ``byte_budget``, when given, is its budget (else
    one of ``budget`` bytes)."""
    return make_pipeline(
        source,
        sink,
        FnModel(run, poison=Rejected),
        budget=byte_budget or budget,
        telemetry=Telemetry(Metrics(), tracing=tracing),
        target_batch_size=target,
        max_wait_s=max_wait_s,
        max_in_flight=2,
        grace_s=grace_s,
    )


async def test_every_row_written_once_and_every_message_acked() -> None:
    deliveries = [message(i, [float(i * 10 + r) for r in range(i % 5)]) for i in range(30)]
    source, sink = FakeSource(deliveries), FakeSink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), timeout=10)
    assert sorted(source.acked) == sorted(d.message_id for d in deliveries)
    want = {(f"chunk-{i}", r): float(i * 10 + r) * 2 for i in range(30) for r in range(i % 5)}
    assert sink.rows == want
    assert not source.nacked
    assert not source.dead


async def test_poison_message_is_dead_lettered_whole_and_its_rows_removed() -> None:
    # Message 1 spans batches (target 4): its first rows are fine, its last row is rejected.
    deliveries = [message(0, [1, 2]), message(1, [3, 4, 5, -1, 6]), message(2, [7])]
    source, sink = FakeSource(deliveries), FakeSink()
    await asyncio.wait_for(make(source, sink, poison_if_negative(double)).run(asyncio.Event()), 10)
    assert [mid for mid, _ in source.dead] == ["m1"]
    assert source.dead[0][1].reason_class.value == "rejected-by-model"
    assert sorted(source.acked) == ["m0", "m2"]
    assert not any(cid == "chunk-1" for cid, _ in sink.rows)
    assert set(sink.rows) == {("chunk-0", 0), ("chunk-0", 1), ("chunk-2", 0)}


async def test_undecodable_message_goes_straight_to_dead_letter() -> None:
    bad = Delivery("bad", b"{not json", {"content-type": "application/json"}, 0.0, 1, "sub")
    source, sink = FakeSource([bad, message(1, [1.0])]), FakeSink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), 10)
    assert [(mid, r.reason_class.value) for mid, r in source.dead] == [("bad", "undecodable")]
    assert source.acked == ["m1"]


async def test_backoff_pauses_source_until_server_recovers() -> None:
    source, sink = FakeSource([message(i, [1.0]) for i in range(8)]), FakeSink()
    release = asyncio.Event()
    pipeline: Pipeline

    async def flaky(batch: Batch) -> Mapping[str, NDArray[Any]]:
        if not release.is_set():
            pipeline.gate.backoff_started()
            await release.wait()
            pipeline.gate.backoff_ended()
        return await double(batch)

    pipeline = make(source, sink, flaky, target=2)
    task = asyncio.create_task(pipeline.run(asyncio.Event()))
    await asyncio.wait_for(source.paused.wait(), 10)
    assert not pipeline.gate.is_open
    release.set()
    await asyncio.wait_for(task, 10)
    assert pipeline.gate.is_open
    assert source.resumes >= 1
    assert len(sink.rows) == 8


async def test_budget_limits_messages_in_flight() -> None:
    # Each message reserves its decoded bytes + 8 bytes/row of outputs; a budget of one
    # message at a time still finishes everything.
    source, sink = FakeSource([message(i, [1.0] * 3) for i in range(10)]), FakeSink()
    await asyncio.wait_for(make(source, sink, budget=60, target=3).run(asyncio.Event()), 10)
    assert len(source.acked) == 10
    assert source.pauses >= 1


async def test_stop_nacks_what_could_not_finish_in_grace() -> None:
    never, started = asyncio.Event(), asyncio.Event()

    async def stuck(batch: Batch) -> Mapping[str, NDArray[Any]]:
        started.set()
        await never.wait()
        raise AssertionError

    source, sink = FakeSource([message(i, [1.0]) for i in range(3)], hold_open=True), FakeSink()
    stop = asyncio.Event()
    pipeline = make(source, sink, stuck, target=1, grace_s=0.01)
    task = asyncio.create_task(pipeline.run(stop))
    await asyncio.wait_for(started.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert sorted(source.nacked) == ["m0", "m1", "m2"]
    assert not source.acked


@pytest.mark.parametrize("rows", [0])
async def test_empty_message_is_acked(rows: int) -> None:
    source, sink = FakeSource([message(0, [])]), FakeSink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), 10)
    assert source.acked == ["m0"]


async def test_a_failing_sink_stops_the_pipeline_and_nacks() -> None:
    class BrokenSink(FakeSink):
        async def write(self, rows: ResultRows) -> int:
            raise OSError("disk full")

    source = FakeSource([message(i, [1.0]) for i in range(4)], hold_open=True)
    with pytest.raises(PipelineFailed, match="disk full"):
        await asyncio.wait_for(make(source, BrokenSink()).run(asyncio.Event()), 10)
    assert not source.acked
    assert sorted(source.nacked) == ["m0", "m1", "m2", "m3"]
