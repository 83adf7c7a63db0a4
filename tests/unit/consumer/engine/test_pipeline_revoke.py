"""The engine's side of scale-out, with fakes: intake keeps no more rows queued than the work
bound (and tells a reading-ahead source the same bound); when the source takes deliveries back,
those not yet sent to the model are dropped at once (budget released, neither acked nor nacked)
and the ones in a request finish as usual."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.sources.base import Withdraw, WorkBound
from rowbatch.consumer.sources.delivery import Delivery
from tests.unit.consumer.engine.factories import make_pipeline, pipeline_settings
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    double,
    message,
)
from tests.unit.consumer.sources.kafka.test_source import until


class RevokableSource(FakeSource):
    """A ``FakeSource`` with the two optional capabilities; counts what it yielded."""

    def __init__(self, deliveries: Sequence[Delivery]) -> None:
        super().__init__(deliveries, hold_open=True)
        self.bound: WorkBound | None = None
        self.withdraw: Withdraw | None = None
        self.yielded = 0

    def bound_read_ahead(self, bound: WorkBound) -> None:
        self.bound = bound

    def on_withdraw(self, withdraw: Withdraw) -> None:
        self.withdraw = withdraw

    async def deliveries(self) -> Any:
        async for d in super().deliveries():
            self.yielded += 1
            yield d

    def take_back(self, deliveries: Sequence[Delivery]) -> list[str]:
        assert self.withdraw is not None
        return sorted(d.message_id for d in self.withdraw(deliveries))


class Server:
    """A model server that holds every request until ``release``."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self.release = asyncio.Event()

    async def run(self, batch: Batch) -> Mapping[str, NDArray[Any]]:
        self.requests.append(sorted({s.message for s in batch.segments}))
        await self.release.wait()
        return await double(batch)


def make(
    source: RevokableSource, sink: FakeSink, server: Server, budget: ByteBudget, target: int
) -> Pipeline:
    return make_pipeline(
        source,
        sink,
        FnModel(server.run),
        budget=budget,
        target_batch_size=target,
        max_wait_s=60.0,
        max_in_flight=1,
    )


async def settle_down(pipeline_task: asyncio.Task[None], rounds: int = 500) -> None:
    """Let every task run until none can make progress (no timed sleeps)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
    assert not pipeline_task.done()


def test_the_default_work_bound_is_two_batches_per_request_in_flight() -> None:
    settings = pipeline_settings(
        target_batch_size=256,
        max_wait_s=0.05,
        max_in_flight=4,
        output_bytes_per_row=8,
        outputs={},
        passthrough=(),
        model_name="m",
        model_version="1",
    )
    assert settings.work == WorkBound(256, 4, 2048)
    assert replace(settings, queued_rows=1000).work.rows == 1000
    assert replace(settings, queued_rows=10).work.rows == 256  # never below one batch


async def test_intake_keeps_no_more_rows_queued_than_the_work_bound() -> None:
    # target 2, one request in flight: the bound is 4 rows.
    source = RevokableSource([message(i, [float(i)]) for i in range(20)])
    server, budget = Server(), ByteBudget(10_000_000)
    stop = asyncio.Event()
    task = asyncio.create_task(make(source, FakeSink(), server, budget, 2).run(stop))
    await settle_down(task)
    assert source.bound == WorkBound(2, 1, 4)
    # m0+m1 in the request, m2+m3 queued for a worker, m4+m5 with the flusher, m6..m9 queued
    # rows (the bound), m10 waiting to be admitted: nothing more taken from the source.
    assert server.requests == [[0, 1]]
    assert source.yielded == 11
    server.release.set()
    await asyncio.wait_for(until_acked(source, 20), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert not source.nacked


async def until_acked(source: FakeSource, n: int) -> None:
    await until(lambda: len(source.acked) >= n)


async def test_withdrawn_messages_not_sent_are_dropped_and_the_rest_finish() -> None:
    deliveries = [message(i, [float(i), float(i)]) for i in range(8)]
    source, sink = RevokableSource(deliveries), FakeSink()
    server, budget = Server(), ByteBudget(10_000_000)
    stop = asyncio.Event()
    pipeline = make(source, sink, server, budget, 2)
    task = asyncio.create_task(pipeline.run(stop))
    await settle_down(task)
    # m0 in the request, m1 queued for the worker, m2 with the flusher, m3 and m4 queued
    # rows, m5 waiting to be admitted.
    assert server.requests == [[0]]
    assert source.yielded == 6
    held = budget.used
    assert source.take_back(deliveries[:6]) == ["m3", "m4", "m5"]
    assert budget.used < held
    assert source.take_back(deliveries[:6]) == []  # already gone; the rest is batched
    server.release.set()
    await asyncio.wait_for(until_acked(source, 5), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    # Taken back: neither acked nor nacked, nor written; m6 and m7 came after and finished.
    assert sorted(source.acked) == ["m0", "m1", "m2", "m6", "m7"]
    assert not source.nacked
    assert {cid for cid, _ in sink.rows} == {f"chunk-{i}" for i in (0, 1, 2, 6, 7)}
    assert budget.used == 0
    # Ledger keys: m6 and m7 are messages 5 and 6 (m5 was taken back before it got one).
    assert server.requests == [[0], [1], [2], [5], [6]]


async def test_a_message_partly_sent_is_not_withdrawn() -> None:
    # target 2: m0's three rows span two batches; its first two are in the request.
    deliveries = [message(0, [1.0, 2.0, 3.0])]
    source, sink = RevokableSource(deliveries), FakeSink()
    server, budget = Server(), ByteBudget(10_000_000)
    stop = asyncio.Event()
    task = asyncio.create_task(make(source, sink, server, budget, 2).run(stop))
    await settle_down(task)
    assert server.requests == [[0]]
    assert source.take_back(deliveries) == []
    server.release.set()
    stop.set()  # its last row is batched when intake ends
    await asyncio.wait_for(task, 10)
    assert source.acked == ["m0"]
    assert len(sink.rows) == 3
