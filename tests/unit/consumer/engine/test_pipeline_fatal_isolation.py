"""A batch failing with a fatal error (a model raising on one message's rows: MLServer and
KServe answer INTERNAL) is bisected like poison: its good messages are written once and acked,
the crashing one is nacked (redelivered, not dead-lettered), and a server failing everything
costs a bounded number of attempts per batch."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.model.inference.errors import FatalInferenceError, PoisonInferenceError
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ResultRows
from rowbatch.wire.dead_letter import ReasonClass
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    RunBatch,
    message,
)

CRASH = -9999.0
"""A row the model raises on: INTERNAL, fatal."""
REJECT = -7777.0
"""A row the model rejects: INVALID_ARGUMENT, poison."""


class CountingSink(FakeSink):
    """Counts how often each row is written (the promise is exactly once)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[tuple[str, int], int] = {}

    async def write(self, rows: ResultRows) -> int:
        stored = await super().write(rows)
        for cid, idx in zip(rows.chunk_id, rows.row_index, strict=True):
            key = (str(cid), int(idx))
            self.times[key] = self.times.get(key, 0) + 1
        return stored


class Model:
    """Answers ``2x``; fails a request holding a CRASH row (fatal) or a REJECT row (poison),
    or every request when ``broken``."""

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken
        self.attempts: list[list[float]] = []

    async def __call__(self, batch: Batch) -> Mapping[str, NDArray[Any]]:
        x = np.asarray(batch.columns["x"])
        self.attempts.append([float(v) for v in x])
        await asyncio.sleep(0)
        if (x == REJECT).any():
            raise PoisonInferenceError("model 'm': INVALID_ARGUMENT", model="m", status="x")
        if self.broken or (x == CRASH).any():
            raise FatalInferenceError(
                "model 'm': INTERNAL: Internal server error", model="m", status="INTERNAL"
            )
        return {"Y": x * 2}


def pipeline(source: FakeSource, sink: FakeSink, run: RunBatch, metrics: Metrics) -> Pipeline:
    return make_pipeline(
        source,
        sink,
        FnModel(run, poison=PoisonInferenceError, fatal=FatalInferenceError),
        metrics=metrics,
        target_batch_size=10,
        max_wait_s=3600,  # one batch of all ten messages
        max_in_flight=2,
    )


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return float(value or 0.0)


async def run_ten(values: list[float], model: Model) -> tuple[FakeSource, CountingSink, Metrics]:
    source, sink, metrics = (
        FakeSource([message(i, [v]) for i, v in enumerate(values)]),
        CountingSink(),
        Metrics(),
    )
    await asyncio.wait_for(pipeline(source, sink, model, metrics).run(asyncio.Event()), 10)
    return source, sink, metrics


async def test_a_crashing_message_is_nacked_alone_and_its_batch_mates_written_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    values = [float(i) for i in range(10)]
    values[3] = CRASH
    model = Model()
    with caplog.at_level(logging.WARNING):
        source, sink, metrics = await run_ten(values, model)
    assert source.nacked == ["m3"]
    assert not source.dead
    assert sorted(source.acked) == sorted(f"m{i}" for i in range(10) if i != 3)
    assert sink.times == {(f"chunk-{i}", 0): 1 for i in range(10) if i != 3}
    assert sink.rows == {(f"chunk-{i}", 0): 2.0 * i for i in range(10) if i != 3}
    # The first attempt, the whole again, then bisecting (+1 to confirm the crasher alone).
    assert len(model.attempts) <= 2 + 2 * math.ceil(math.log2(10)) + 1
    assert counter(metrics, "rowbatch_messages_nacked_total") == 1
    assert "inference failed for good on 1 of the batch's 10 messages" in caplog.text


async def test_a_server_failing_everything_costs_bounded_attempts_and_nacks_the_batch() -> None:
    model = Model(broken=True)
    source, sink, metrics = await run_ten([float(i) for i in range(10)], model)
    assert sorted(source.nacked) == sorted(f"m{i}" for i in range(10))
    assert not source.acked and not source.dead and not sink.times
    # The first attempt, then 1 + ceil(log2 10) in the isolation (which starts from the first
    # attempt's failure), not the 19 of a full bisection.
    assert len(model.attempts) == 1 + 1 + math.ceil(math.log2(10))
    assert counter(metrics, "rowbatch_messages_nacked_total") == 10


async def test_a_single_message_failing_fatally_is_nacked_at_once() -> None:
    model = Model()
    source, sink, _ = await run_ten([CRASH], model)
    assert source.nacked == ["m0"]
    assert model.attempts == [[CRASH]]
    assert not sink.times


async def test_poison_and_a_crasher_in_one_batch_dead_letter_one_and_nack_the_other() -> None:
    values = [float(i) for i in range(10)]
    values[2], values[7] = REJECT, CRASH
    source, sink, metrics = await run_ten(values, Model())
    assert [(mid, r.reason_class) for mid, r in source.dead] == [
        ("m2", ReasonClass.REJECTED_BY_MODEL)
    ]
    assert source.nacked == ["m7"]
    good = [i for i in range(10) if i not in (2, 7)]
    assert sorted(source.acked) == sorted(f"m{i}" for i in good)
    assert sink.times == {(f"chunk-{i}", 0): 1 for i in good}
    assert (
        counter(metrics, "rowbatch_messages_dead_lettered_total", reason="rejected-by-model") == 1
    )


async def test_two_crashers_are_both_found_and_the_rest_written_once() -> None:
    values = [float(i) for i in range(10)]
    values[1], values[8] = CRASH, CRASH
    source, sink, _ = await run_ten(values, Model())
    assert sorted(source.nacked) == ["m1", "m8"]
    assert sink.times == {(f"chunk-{i}", 0): 1 for i in range(10) if i not in (1, 8)}


async def test_an_error_isolation_cannot_handle_nacks_the_batch_and_the_consumer_goes_on() -> None:
    # Not an inference error at all (a bug building the request, say): not bisected, not
    # tried again; the batch's messages are nacked.
    calls: list[int] = []

    async def broken(batch: Batch) -> Mapping[str, NDArray[Any]]:
        calls.append(len(batch.segments))
        raise ValueError("cannot build the request")

    source, sink, metrics = (
        FakeSource([message(i, [float(i)]) for i in range(10)]),
        CountingSink(),
        Metrics(),
    )
    await asyncio.wait_for(pipeline(source, sink, broken, metrics).run(asyncio.Event()), 10)
    assert sorted(source.nacked) == sorted(f"m{i}" for i in range(10))
    assert calls == [10]
    assert not source.dead and not sink.times
