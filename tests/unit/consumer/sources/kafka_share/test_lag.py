"""The share group's lag as gauges (``kafka_share/lag.py``), with a fake reader and an injected
clock: the broker's -1 is NaN, never a number, and stays out of the total; a failing read is
counted and logged (at once, then at most once a minute); past ``stale_after_s`` the gauges
are NaN until a read succeeds; ``run`` reads every ``lag_interval_s``; ``close`` closes the
reader."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from rowbatch.consumer.sources.kafka_share.lag import ShareLagMonitor
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.kafka_share.share_offsets import (
    ShareOffsetsError,
    SharePartitionOffset,
    Topics,
)

TOPIC = "rows"


def settings(**extra: Any) -> KafkaShareSettings:
    return KafkaShareSettings.model_validate(
        {"bootstrap_servers": "b:9092", "topic": TOPIC, "group_id": "scorers", **extra}
    )


class FakeReader:
    """Answers each read with the next of ``answers``: ``{partition: (start, lag)}`` or an
    exception to raise."""

    def __init__(self, *answers: dict[int, tuple[int, int]] | BaseException) -> None:
        self.answers = list(answers)
        self.asked: list[Topics | None] = []
        self.closed = False

    async def partitions(self, topic: str) -> list[int]:
        assert topic == TOPIC
        return [0, 1]

    async def read(self, topics: Topics | None = None) -> dict[tuple[str, int], Any]:
        self.asked.append(topics)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        offsets = {(TOPIC, p): SharePartitionOffset(s, 0, lag) for p, (s, lag) in answer.items()}
        offsets[("other-topic", 0)] = SharePartitionOffset(0, 0, 99)  # not ours: left out
        return offsets

    async def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor(
    reader: FakeReader, clock: Clock | None = None, **extra: Any
) -> tuple[ShareLagMonitor, CollectorRegistry]:
    registry = CollectorRegistry()
    clock = clock or Clock()
    made = ShareLagMonitor(
        settings(**extra),
        registry,
        reader=reader,  # type: ignore[arg-type]
        clock=clock,
        wall=lambda: clock.now + 1e9,
    )
    return made, registry


def lag(registry: CollectorRegistry, partition: int) -> float | None:
    return registry.get_sample_value(
        "rowbatch_kafka_share_lag", {"topic": TOPIC, "partition": str(partition)}
    )


def total(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("rowbatch_kafka_share_lag_total", {"topic": TOPIC})


def failures(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value(
        "rowbatch_kafka_share_lag_read_failures_total", {"topic": TOPIC}
    )


def test_the_interval_is_a_setting() -> None:
    assert settings().lag_interval_s == 15.0
    assert settings(lag_interval_s=2.5).lag_interval_s == 2.5
    with pytest.raises(ValidationError):
        settings(lag_interval_s=0)


async def test_the_lag_of_every_partition_is_exported() -> None:
    reader = FakeReader({0: (10, 7), 1: (4, 0)})
    made, registry = monitor(reader)
    assert failures(registry) == 0.0  # exported from the start
    assert await made.read_once()
    assert reader.asked == [{TOPIC: [0, 1]}]
    assert (lag(registry, 0), lag(registry, 1), total(registry)) == (7.0, 0.0, 7.0)
    assert registry.get_sample_value(
        "rowbatch_kafka_share_lag_updated_timestamp_seconds", {"topic": TOPIC}
    ) == pytest.approx(1000.0 + 1e9)
    assert (
        registry.get_sample_value(
            "rowbatch_kafka_share_lag", {"topic": "other-topic", "partition": "0"}
        )
        is None
    )


async def test_an_unknown_lag_is_nan_and_left_out_of_the_total() -> None:
    reader = FakeReader({0: (-1, -1), 1: (0, 5)}, {0: (-1, -1), 1: (-1, -1)})
    made, registry = monitor(reader)
    await made.read_once()
    assert math.isnan(lag(registry, 0) or 0.0)
    assert (lag(registry, 1), total(registry)) == (5.0, 5.0)
    await made.read_once()
    assert math.isnan(total(registry) or 0.0), "no partition known: no total"


async def test_failing_reads_are_counted_then_the_gauges_withdrawn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    boom = ShareOffsetsError("NOT_COORDINATOR (error 16)")
    reader = FakeReader({0: (0, 3), 1: (0, 4)}, boom, boom, boom, {0: (0, 1), 1: (0, 0)})
    made, registry = monitor(reader, clock)
    assert made.stale_after_s == 45.0  # three intervals of 15 s
    caplog.set_level(logging.WARNING, logger="rowbatch.consumer.sources.kafka_share.lag")

    assert await made.read_once()
    clock.now += 15
    assert not await made.read_once()
    clock.now += 15
    assert not await made.read_once()
    assert failures(registry) == 2.0
    assert (lag(registry, 0), total(registry)) == (3.0, 7.0), "still the last figures"
    assert not made.stale

    clock.now += 15  # 45 s since the last good read
    assert not await made.read_once()
    assert made.stale
    assert math.isnan(lag(registry, 0) or 0.0)
    assert math.isnan(lag(registry, 1) or 0.0)
    assert math.isnan(total(registry) or 0.0)

    clock.now += 15
    assert await made.read_once()
    assert not made.stale
    assert (lag(registry, 0), lag(registry, 1), total(registry)) == (1.0, 0.0, 1.0)
    assert failures(registry) == 3.0

    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages  # the first failure, staleness, the recovery
    assert "for 15 s (ShareOffsetsError: NOT_COORDINATOR (error 16))" in messages[0]
    assert "withdrawn after 45 s" in messages[0]
    assert "are NaN (not known) until a read succeeds" in messages[1]
    assert (
        "read again after 45 s of failures; the rowbatch_kafka_share_lag gauges are"
        in (messages[2])
    )


async def test_a_failure_is_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    reader = FakeReader(*[OSError("refused")] * 121)
    made, registry = monitor(reader, clock, lag_interval_s=1.0)
    assert made.stale_after_s == 30.0  # at least 30 s
    caplog.set_level(logging.WARNING, logger="rowbatch.consumer.sources.kafka_share.lag")
    for _ in range(121):  # no read ever succeeded: counted from the first failure
        await made.read_once()
        clock.now += 1
    assert failures(registry) == 121.0
    ages = [r.args[1] for r in caplog.records if isinstance(r.args, tuple)]
    assert ages == [0.0, 30.0, 90.0]  # the first, the staleness, a minute later
    assert made.stale


async def test_a_read_past_its_time_is_a_failure() -> None:
    class Slow(FakeReader):
        async def read(self, topics: Topics | None = None) -> dict[tuple[str, int], Any]:
            await asyncio.Event().wait()
            raise AssertionError("never")

    class Quick(ShareLagMonitor):
        read_timeout_s = 0.01

    registry = CollectorRegistry()
    made = Quick(settings(), registry, reader=Slow())  # type: ignore[arg-type]
    assert not await made.read_once()
    assert failures(registry) == 1.0


async def test_run_reads_every_interval_and_close_closes_the_reader() -> None:
    reader = FakeReader({0: (0, 1)}, OSError("x"), {0: (0, 0)})
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    registry = CollectorRegistry()
    made = ShareLagMonitor(
        settings(lag_interval_s=2.0),
        registry,
        reader=reader,  # type: ignore[arg-type]
        sleep=sleep,
    )
    with pytest.raises(asyncio.CancelledError):
        await made.run()
    assert slept == [2.0, 2.0, 2.0]
    assert len(reader.asked) == 3
    assert (lag(registry, 0), failures(registry)) == (0.0, 1.0)
    await made.close()
    assert reader.closed


def test_the_default_reader_is_the_source_s_group() -> None:
    made = ShareLagMonitor(settings(lag_interval_s=20.0), CollectorRegistry())
    assert made.read_timeout_s == 20.0
    assert made.stale_after_s == 60.0
    assert made._reader.group == "scorers"
