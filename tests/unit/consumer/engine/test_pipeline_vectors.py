"""Deliveries taken in vectors (a source with ``vectors()``): the same outcome as one by one
(rows bit for bit, dead letters and their reasons, acks, nacks, counters, the budget), over
generated mixes of good and poison messages and vector cuts; and what only a vector has: the
part not yet taken can be withdrawn, and is nacked when intake is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ResultRows, RowsRejected
from rowbatch.consumer.sources.delivery import Delivery
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    Rejected,
    double,
    message,
)
from tests.unit.consumer.engine.test_pipeline_revoke import RevokableSource, Server, settle_down

SINK_REFUSES = 666.0
"""A value the fake sink cannot store (its message is dead-lettered ``rejected-by-sink``)."""


class VectorSource(RevokableSource):
    """A ``RevokableSource`` that yields its deliveries in vectors of the given ``sizes`` (the
    last one repeated) and acks many at once."""

    def __init__(
        self, deliveries: Sequence[Delivery], sizes: Sequence[int], *, hold_open: bool = True
    ) -> None:
        super().__init__(deliveries)
        self._hold_open = hold_open
        self._sizes = list(sizes) or [1]
        self.vectors_yielded = 0
        self.ack_calls = 0

    async def vectors(self) -> Any:
        at, i = 0, 0
        while at < len(self._deliveries):
            size = self._sizes[min(i, len(self._sizes) - 1)]
            vector = self._deliveries[at : at + size]
            at, i = at + size, i + 1
            self.yielded += len(vector)
            self.vectors_yielded += 1
            yield vector
        if self._hold_open:
            await asyncio.Event().wait()

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        self.ack_calls += 1
        self.acked.extend(d.message_id for d in deliveries)


class PickySink(FakeSink):
    """Refuses any write holding ``SINK_REFUSES`` (twice the value 333 of a message)."""

    async def write(self, rows: ResultRows) -> int:
        if (np.asarray(rows.outputs["y"]) == SINK_REFUSES).any():
            raise RowsRejected("value 666 cannot be stored", code="sink_rejected_value")
        return await super().write(rows)


async def model_run(batch: Batch) -> Mapping[str, NDArray[Any]]:
    if (np.asarray(batch.columns["x"]) < 0).any():
        raise Rejected("negative value")
    return await double(batch)


def pipeline(source: FakeSource, sink: FakeSink, metrics: Metrics, budget: ByteBudget) -> Pipeline:
    return make_pipeline(
        source,
        sink,
        FnModel(model_run, poison=Rejected),
        budget=budget,
        metrics=metrics,
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=2,
    )


def undecodable(i: int) -> Delivery:
    good = message(i, [1.0])
    return Delivery(good.message_id, b"{not json", good.attributes, 0.0, 1, "sub")


KINDS = ("good", "empty", "undecodable", "model_rejects", "sink_refuses")


def build(kind: str, i: int, rows: int) -> Delivery:
    values = [float(i * 10 + r) for r in range(rows)]
    if kind == "empty":
        return message(i, [])
    if kind == "undecodable":
        return undecodable(i)
    if kind == "model_rejects":
        return message(i, [*values, -1.0])
    if kind == "sink_refuses":
        return message(i, [*values, SINK_REFUSES / 2])
    return message(i, values)


COUNTERS = (
    "rowbatch_messages_received_total",
    "rowbatch_rows_received_total",
    "rowbatch_messages_acked_total",
    "rowbatch_rows_written_total",
    "rowbatch_messages_nacked_total",
    "rowbatch_receive_age_seconds_count",
    "rowbatch_end_to_end_seconds_count",
)


def counters(registry: CollectorRegistry) -> dict[str, float]:
    out = {name: registry.get_sample_value(name) or 0.0 for name in COUNTERS}
    for family in registry.collect():
        if family.name == "rowbatch_messages_dead_lettered":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[f"dead:{sample.labels['reason']}"] = sample.value
    return out


def outcome(source: FakeSource, sink: FakeSink, metrics: Metrics, budget: ByteBudget) -> Any:
    return (
        sorted(source.acked),
        sorted(source.nacked),
        sorted((mid, r.reason_class.value, r.code) for mid, r in source.dead),
        sink.rows,
        sorted(sink.deleted),
        counters(metrics.registry),
        budget.used,
    )


async def run_to_end(deliveries: Sequence[Delivery], sizes: Sequence[int] | None) -> Any:
    source: FakeSource = (
        FakeSource(deliveries)
        if sizes is None
        else VectorSource(deliveries, sizes, hold_open=False)
    )
    sink, metrics, budget = PickySink(), Metrics(), ByteBudget(10_000_000)
    await asyncio.wait_for(pipeline(source, sink, metrics, budget).run(asyncio.Event()), 30)
    return outcome(source, sink, metrics, budget)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mix=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 5)), min_size=1, max_size=40),
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
)
def test_vectors_and_one_by_one_end_alike(mix: list[tuple[str, int]], sizes: list[int]) -> None:
    deliveries = [build(kind, i, rows) for i, (kind, rows) in enumerate(mix)]
    one_by_one = asyncio.run(run_to_end(deliveries, None))
    in_vectors = asyncio.run(run_to_end(deliveries, sizes))
    assert in_vectors == one_by_one
    acked, nacked, dead, rows, _, counted, used = in_vectors
    assert sorted([*acked, *(d[0] for d in dead)]) == sorted(d.message_id for d in deliveries)
    assert not nacked
    assert used == 0
    assert counted["rowbatch_messages_received_total"] == len(deliveries)
    assert counted["rowbatch_receive_age_seconds_count"] == len(deliveries)
    assert counted["rowbatch_messages_acked_total"] == len(acked)
    assert counted["rowbatch_end_to_end_seconds_count"] == len(acked)
    # Rows of a message dead-lettered after some were written are deleted again.
    assert counted["rowbatch_rows_written_total"] >= len(rows)
    assert sum(v for k, v in counted.items() if k.startswith("dead:")) == len(dead)


async def test_a_vector_is_counted_once_and_acked_per_write() -> None:
    deliveries = [message(i, [float(i)]) for i in range(64)]
    source = VectorSource(deliveries, [64], hold_open=False)
    sink, metrics, budget = FakeSink(), Metrics(), ByteBudget(10_000_000)
    await asyncio.wait_for(pipeline(source, sink, metrics, budget).run(asyncio.Event()), 10)
    assert source.vectors_yielded == 1
    assert sorted(source.acked) == sorted(d.message_id for d in deliveries)
    assert source.ack_calls <= sink.writes < len(deliveries)
    counted = counters(metrics.registry)
    assert counted["rowbatch_receive_age_seconds_count"] == 64
    assert counted["rowbatch_messages_received_total"] == 64
    assert counted["rowbatch_rows_received_total"] == 64
    assert counted["rowbatch_messages_acked_total"] == 64
    assert counted["rowbatch_end_to_end_seconds_count"] == 64
    assert budget.used == 0


async def test_the_part_of_a_vector_not_yet_taken_is_withdrawn() -> None:
    # target 2, one request in flight: the work bound is 4 rows. One vector of 12 messages:
    # two in the request, two with a worker, two with the flusher, four queued (the bound),
    # one waiting to be admitted, the last still in the vector.
    deliveries = [message(i, [float(i)]) for i in range(12)]
    source, sink = VectorSource(deliveries, [12]), FakeSink()
    server, budget = Server(), ByteBudget(10_000_000)
    stop = asyncio.Event()
    task = asyncio.create_task(revokable(source, sink, server, budget).run(stop))
    await settle_down(task)
    assert server.requests == [[0, 1]]
    taken_back = source.take_back(deliveries)
    assert taken_back == sorted(f"m{i}" for i in range(6, 12))
    assert source.take_back(deliveries) == []
    server.release.set()
    await asyncio.wait_for(until_settled(source, 6), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert sorted(source.acked) == [f"m{i}" for i in range(6)]
    assert not source.nacked
    assert {cid for cid, _ in sink.rows} == {f"chunk-{i}" for i in range(6)}
    assert budget.used == 0


async def test_stopping_nacks_the_part_of_a_vector_not_yet_taken() -> None:
    deliveries = [message(i, [float(i)]) for i in range(12)]
    source, sink = VectorSource(deliveries, [12]), FakeSink()
    server, budget = Server(), ByteBudget(10_000_000)
    stop = asyncio.Event()
    task = asyncio.create_task(revokable(source, sink, server, budget, grace_s=0.0).run(stop))
    await settle_down(task)
    assert server.requests == [[0, 1]]
    stop.set()
    server.release.set()
    await asyncio.wait_for(task, 10)
    # Every delivery settled exactly once, the ones still in the vector nacked.
    assert sorted([*source.acked, *source.nacked]) == sorted(d.message_id for d in deliveries)
    assert {"m10", "m11"} <= set(source.nacked)  # waiting to be admitted, still in the vector
    assert budget.used == 0


def revokable(
    source: VectorSource, sink: FakeSink, server: Server, budget: ByteBudget, grace_s: float = 5.0
) -> Pipeline:
    return make_pipeline(
        source,
        sink,
        FnModel(server.run),
        budget=budget,
        target_batch_size=2,
        max_wait_s=60.0,
        max_in_flight=1,
        grace_s=grace_s,
    )


async def until_settled(source: FakeSource, n: int) -> None:
    for _ in range(100_000):
        if len(source.acked) + len(source.nacked) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{n} deliveries not settled")
