"""The writers' queue is bounded in rows: a put waits while the queue is full, one part always
fits in an empty queue, a stop signal is never held back; and in a pipeline whose sink is slower
than its model, the model answers no more rows than :attr:`PipelineSettings.model_work_at_risk`
ahead of the writes (with an unbounded queue it answered every message while the sink was
held)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from rowbatch.consumer.engine.answered_queue import AnsweredQueue
from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.sinks.base import ResultRows
from tests.unit.consumer.engine.factories import make_pipeline, pipeline_settings
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    message,
)


def part(rows: int) -> Answered:
    batch = Batch(
        columns={"x": np.zeros(rows)}, nulls={}, segments=(Segment(0, 0, rows),), oldest_at=0.0
    )
    return Answered(batch, {"Y": np.zeros(rows)}, "1")


async def settle() -> None:
    """Lets every ready task run (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_put_waits_while_the_queue_is_full_and_goes_on_when_rows_are_taken() -> None:
    queue = AnsweredQueue(max_rows=10)
    await queue.put(part(6))
    await queue.put(part(4))
    assert queue.rows == 10
    third = asyncio.create_task(queue.put(part(3)))
    await settle()
    assert not third.done() and len(queue) == 2
    first = await queue.get()
    assert first is not None and len(first.batch) == 6
    await settle()
    assert third.done() and queue.rows == 7


async def test_one_part_fits_an_empty_queue_and_a_stop_signal_is_never_held() -> None:
    queue = AnsweredQueue(max_rows=4)
    await asyncio.wait_for(queue.put(part(9)), 1)  # larger than the bound, queue empty
    await asyncio.wait_for(queue.put(None), 1)  # full, but a stop signal
    assert len(queue) == 2 and queue.rows == 9
    assert (await queue.get()) is not None
    assert (await queue.get()) is None
    assert queue.empty() and queue.rows == 0
    with pytest.raises(asyncio.QueueEmpty):
        queue.get_nowait()
    with pytest.raises(ValueError, match="at least 1"):
        AnsweredQueue(0)


async def test_a_get_waits_for_a_put() -> None:
    queue = AnsweredQueue(max_rows=4)
    got = asyncio.create_task(queue.get())
    await settle()
    assert not got.done()
    queue.put_nowait(part(2))
    assert (await asyncio.wait_for(got, 1)) is not None


class HeldSink(FakeSink):
    """Writes nothing until ``release`` is set: a sink far slower than the model."""

    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release

    async def write(self, rows: ResultRows) -> int:
        await self.release.wait()
        return await super().write(rows)


async def test_inference_waits_for_a_slow_sink_within_the_stated_bound() -> None:
    fields: dict[str, Any] = {
        "target_batch_size": 4,
        "max_wait_s": 0.0,
        "max_in_flight": 2,
        "write_concurrency": 2,
        "max_write_rows": 8,
    }
    settings = pipeline_settings(**fields)
    assert settings.answered_rows == 16
    assert settings.model_work_at_risk == 2 * 4 + 16 + 2 * 8
    answered_rows = 0
    model_idle = asyncio.Event()

    async def run(batch: Batch) -> Answer:
        nonlocal answered_rows
        answered_rows += len(batch)
        return Answer({"Y": np.asarray(batch.columns["x"]) * 2}, "1")

    release = asyncio.Event()
    # 100 messages of 4 rows: 400 rows, ten times the bound; the budget holds them all.
    deliveries = [message(i, [float(4 * i + r) for r in range(4)]) for i in range(100)]
    source, sink = FakeSource(deliveries), HeldSink(release)
    pipeline = make_pipeline(source, sink, FnModel(run), budget=100_000_000, **fields)
    task = asyncio.create_task(pipeline.run(asyncio.Event()))
    for _ in range(200):  # until the model stops answering (the writers' queue is full)
        before = answered_rows
        await settle()
        if answered_rows == before and answered_rows > 0:
            model_idle.set()
            break
    assert model_idle.is_set()
    assert 0 < answered_rows <= settings.model_work_at_risk
    release.set()
    await asyncio.wait_for(task, 10)
    assert len(source.acked) == 100 and len(sink.rows) == 400
    assert answered_rows == 400
