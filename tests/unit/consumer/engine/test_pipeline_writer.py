"""The writer stage with fakes: sink outages ridden through with a pause, rows a sink can never
store isolated and dead-lettered as ``rejected-by-sink``, answered batches coalesced into one
write, and inference that goes on while a write is slow."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from numpy.typing import NDArray
from prometheus_client import generate_latest

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ResultRows, RowsRejected, SinkUnavailable
from rowbatch.timing import Backoff, Clocks
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    double,
    message,
)


class FlakySink(FakeSink):
    """Unavailable for the first ``outage`` writes; rejects any write holding ``bad`` values."""

    def __init__(self, *, outage: int = 0, bad: float | None = None) -> None:
        super().__init__()
        self.outage = outage
        self.bad = bad
        self.attempts = 0
        self.sizes: list[int] = []

    async def write(self, rows: ResultRows) -> int:
        self.attempts += 1
        if self.attempts <= self.outage:
            raise SinkUnavailable("connection refused (server restarting)")
        if self.bad is not None and (rows.outputs["y"] == self.bad).any():
            raise RowsRejected('invalid byte sequence for encoding "UTF8": 0x00', code="nul")
        self.sizes.append(len(rows))
        return await super().write(rows)


def pipeline(
    source: FakeSource,
    sink: FakeSink,
    *,
    target: int = 4,
    in_flight: int = 2,
    waits: list[float] | None = None,
    run: Any = double,
    budget: int = 10_000_000,
    writers: int = 2,
) -> tuple[Pipeline, Metrics]:
    recorded = waits if waits is not None else []

    async def sleep(seconds: float) -> None:
        recorded.append(seconds)
        await asyncio.sleep(0)

    metrics = Metrics()
    p = make_pipeline(
        source,
        sink,
        FnModel(run),
        budget=budget,
        metrics=metrics,
        clocks=Clocks(sleep=sleep),
        target_batch_size=target,
        max_wait_s=0.0,
        max_in_flight=in_flight,
        grace_s=5.0,
        write_concurrency=writers,
        sink_backoff=Backoff(0.5, 4.0, jitter=0.0),
    )
    return p, metrics


def value(metrics: Metrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    assert got is not None, f"{name}{labels} has no series"
    return got


async def test_sink_outage_pauses_and_retries_until_written_once() -> None:
    deliveries = [message(i, [float(i)] * 3) for i in range(10)]
    source, sink = FakeSource(deliveries), FlakySink(outage=6)
    waits: list[float] = []
    p, metrics = pipeline(source, sink, waits=waits, writers=1)
    await asyncio.wait_for(p.run(asyncio.Event()), 10)
    assert sorted(source.acked) == sorted(d.message_id for d in deliveries)
    assert not source.nacked
    assert not source.dead
    assert len(sink.rows) == 30
    assert source.pauses >= 1  # consumption paused while the sink was down
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]  # exponential, capped at max_s
    assert value(metrics, "rowbatch_sink_errors_total", kind="unavailable") == 6
    assert value(metrics, "rowbatch_paused", why="backoff") == 0


async def test_rows_the_sink_rejects_are_dead_lettered_and_the_rest_written() -> None:
    # Message 3 spans batches (target 4): its row with value 21 (doubled: 42) is rejected.
    deliveries = [message(0, [1, 2]), message(1, [3]), message(2, [4, 5, 6])]
    deliveries += [message(3, [7, 8, 9, 21, 10]), message(4, [11]), message(5, [12, 13])]
    source, sink = FakeSource(deliveries), FlakySink(bad=42.0)
    p, metrics = pipeline(source, sink)
    await asyncio.wait_for(p.run(asyncio.Event()), 10)
    assert [mid for mid, _ in source.dead] == ["m3"]
    reason = source.dead[0][1]
    assert reason.reason_class.value == "rejected-by-sink"
    assert reason.code == "nul"
    assert "0x00" in reason.message
    assert sorted(source.acked) == ["m0", "m1", "m2", "m4", "m5"]
    assert not any(cid == "chunk-3" for cid, _ in sink.rows)  # its written rows removed
    assert len(sink.rows) == 2 + 1 + 3 + 1 + 2
    assert value(metrics, "rowbatch_messages_dead_lettered_total", reason="rejected-by-sink") == 1


async def test_answered_batches_waiting_for_the_sink_are_written_together() -> None:
    gate = asyncio.Event()

    class SlowSink(FlakySink):
        async def write(self, rows: ResultRows) -> int:
            await gate.wait()
            return await super().write(rows)

    deliveries = [message(i, [float(i)] * 4) for i in range(12)]
    source, sink = FakeSource(deliveries), SlowSink()
    calls = 0

    async def counted(batch: Batch) -> Mapping[str, NDArray[Any]]:
        nonlocal calls
        calls += 1
        if calls == 12:
            gate.set()  # every batch was answered while the sink held the first writes
        return await double(batch)

    p, _ = pipeline(source, sink, in_flight=2, run=counted)
    await asyncio.wait_for(p.run(asyncio.Event()), 10)
    assert calls == 12  # inference did not wait for the 2 blocked writes
    assert len(sink.rows) == 48
    assert len(sink.sizes) < 12  # group commit: fewer writes than batches
    assert max(sink.sizes) > 4


async def test_every_labelled_series_exists_at_zero_from_the_start() -> None:
    text = generate_latest(Metrics().registry).decode()
    for line in (
        'rowbatch_messages_dead_lettered_total{reason="rejected-by-sink"} 0.0',
        'rowbatch_messages_dead_lettered_total{reason="too-many-attempts"} 0.0',
        'rowbatch_inference_errors_total{kind="unavailable"} 0.0',
        'rowbatch_inference_errors_total{kind="not-found"} 0.0',
        'rowbatch_sink_errors_total{kind="unavailable"} 0.0',
        'rowbatch_paused{why="backoff"} 0.0',
        'rowbatch_paused{why="budget"} 0.0',
    ):
        assert line in text, line
