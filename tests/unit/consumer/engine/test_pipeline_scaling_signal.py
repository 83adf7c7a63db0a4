"""The engine's side of the autoscaling signal, with an injected clock: the age of the oldest
message taken and not yet settled (``rowbatch_oldest_unwritten_age_seconds``, from the
ledger), the receive age of every message, and what the watch tells the scaling signal."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.scaling import ScalingSignal, SignalSettings
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.scaling_settings import ScalingInputs
from rowbatch.timing import Clocks
from rowbatch.wire.chunks.encode import encode_chunk
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, FnModel, double


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def published(i: int, rows: int, at: float) -> Delivery:
    enc = encode_chunk("t", {"x": np.arange(rows, dtype=np.float64)}, "json", f"chunk-{i}")
    return Delivery(f"m{i}", enc.payload, enc.attributes, at, 1, "sub")


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_the_ledger_knows_the_oldest_publish_time() -> None:
    ledger = Ledger()
    assert ledger.oldest_published_at() is None
    a = ledger.open(published(0, 1, 1000.0), "c0", 1, 10, 5.0)
    ledger.open(published(1, 1, 990.0), "c1", 1, 10, 6.0)
    assert ledger.oldest_published_at() == 990.0
    ledger.written(1, 1)
    assert ledger.oldest_published_at() == 1000.0
    ledger.written(a.key, 1)
    assert ledger.oldest_published_at() is None


async def test_the_oldest_unwritten_age_and_the_receive_age_follow_the_clock() -> None:
    wall = Clock(1000.0)
    mono = Clock(40.0)
    metrics = Metrics()
    signal = ScalingSignal(
        SignalSettings(
            "share",
            10.0,
            ScalingInputs(rows_per_s_per_replica=100.0, rate_window_s=60.0),
            slots_fill_server=False,
        ),
        metrics.scaling,
    )
    release = asyncio.Event()

    async def held(batch: Batch) -> Mapping[str, NDArray[Any]]:
        await release.wait()
        return await double(batch)

    # published 30 s and 12 s before the consumer takes them
    source = FakeSource([published(0, 3, 970.0), published(1, 2, 988.0)], hold_open=True)
    sink = FakeSink()
    pipeline = make_pipeline(
        source,
        sink,
        FnModel(held),
        telemetry=Telemetry(metrics, signal),
        clocks=Clocks(monotonic=mono, wall=wall),
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=2,
        watch_interval_s=3600,  # checked by hand below
    )
    registry = metrics.registry
    pipeline.watch.check()  # nothing taken yet
    assert sample(registry, "rowbatch_oldest_unwritten_age_seconds") == 0.0
    mono.now = 45.0
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop))
    for _ in range(100):
        await asyncio.sleep(0)
        if sample(registry, "rowbatch_messages_received_total") == 2:
            break
    assert sample(registry, "rowbatch_receive_age_seconds_count") == 2
    assert sample(registry, "rowbatch_receive_age_seconds_sum") == 30.0 + 12.0
    bucket = "rowbatch_receive_age_seconds_bucket"
    assert registry.get_sample_value(bucket, {"le": "15.0"}) == 1
    assert registry.get_sample_value(bucket, {"le": "30.0"}) == 2

    pipeline.watch.check()
    assert sample(registry, "rowbatch_oldest_unwritten_age_seconds") == 30.0
    wall.now, mono.now = 1005.0, 47.0
    pipeline.watch.check()
    assert sample(registry, "rowbatch_oldest_unwritten_age_seconds") == 35.0

    release.set()
    for _ in range(200):
        await asyncio.sleep(0)
        if len(source.acked) == 2:
            break
    assert sorted(source.acked) == ["m0", "m1"]
    wall.now, mono.now = 1010.0, 49.0
    pipeline.watch.check()
    assert sample(registry, "rowbatch_oldest_unwritten_age_seconds") == 0.0
    own = signal.own_rates()
    # 5 rows received and written in the 9 s since the first check, received at 30 s and 12 s
    assert own.received_rows_per_s == pytest.approx(5 / 9)
    assert own.written_rows_per_s == pytest.approx(5 / 9)
    assert own.receive_age_s == pytest.approx((3 * 30.0 + 2 * 12.0) / 5)
    # the share: 22.8 s x 5/9 rows/s / (10 s x 100) + (5/9) / 100
    assert sample(registry, "rowbatch_replica_load") == pytest.approx(22.8 * 5 / 9 / 1000 + 5 / 900)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_the_watch_reports_backoff_and_full_slots_to_the_signal() -> None:
    metrics = Metrics()
    signal = ScalingSignal(
        SignalSettings("share", 10.0, ScalingInputs(rows_per_s_per_replica=100.0)),
        metrics.scaling,
    )
    mono = Clock(0.0)
    release = asyncio.Event()
    pipeline: Pipeline

    async def stuck(batch: Batch) -> Mapping[str, NDArray[Any]]:
        pipeline.gate.backoff_started()
        await release.wait()
        pipeline.gate.backoff_ended()
        return await double(batch)

    source = FakeSource([published(i, 4, 0.0) for i in range(4)], hold_open=True)
    pipeline = make_pipeline(
        source,
        FakeSink(),
        FnModel(stuck),
        telemetry=Telemetry(metrics, signal),
        clocks=Clocks(monotonic=mono),
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=1,
        watch_interval_s=3600,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop))
    for _ in range(100):
        await asyncio.sleep(0)
        if source.pauses:
            break
    for t in range(1, 11):
        mono.now = float(t)
        pipeline.watch.check()
    assert signal.conditions.backing_off
    assert signal.conditions.server_full  # the one slot busy in every sample
    release.set()
    for _ in range(200):
        await asyncio.sleep(0)
        if len(source.acked) == 4:
            break
    mono.now = 11.0
    pipeline.watch.check()
    assert not signal.conditions.backing_off
    stop.set()
    await asyncio.wait_for(task, 10)


class SelfBoundSource(FakeSource):
    """A source that bounds what it hands out itself (``SaturatesItself``)."""

    full = False

    def at_capacity(self) -> bool:
        return self.full


def test_a_source_at_its_own_capacity_makes_the_replica_count_as_saturated() -> None:
    """A share group's members each hold one poll: the replica can run at its capacity with
    no work waiting for room in the pipeline, and then its rate is still its capacity."""
    source = SelfBoundSource([], hold_open=True)
    pipeline = make_pipeline(
        source, FakeSink(), FnModel(double), target_batch_size=4, max_wait_s=0.0, max_in_flight=1
    )
    assert not pipeline._waiting_for_room()
    source.full = True
    assert pipeline._waiting_for_room()
    plain = make_pipeline(
        FakeSource([]),
        FakeSink(),
        FnModel(double),
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=1,
    )
    assert not plain._waiting_for_room()
