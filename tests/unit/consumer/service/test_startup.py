"""Start-up waits out an unavailable dependency with backoff (injected clock and sleep), passes
any other error through at once, and gives up after the configured wait naming the setting;
the broker too (``open_source``), closing a source it gives up on."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from rowbatch.consumer.service.build_io import SOURCE_STARTUP_BACKOFF, open_source
from rowbatch.consumer.service.startup import StillUnavailable, wait_for
from rowbatch.consumer.sources.base import SourceConfigError, SourceUnreachable
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.timing import Backoff, Clocks
from tests.virtual_time import VirtualTime


class Down(Exception):
    pass


Op = Callable[[], Awaitable[str]]


def flaky(failures: int, error: Exception) -> tuple[list[int], Op]:
    calls: list[int] = []

    async def op() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "up"

    return calls, op


def clocks(time: VirtualTime) -> Clocks:
    return Clocks(monotonic=time.clock, sleep=time.sleep)


async def wait(op: Op, clock: VirtualTime, wait_s: float = 10.0) -> str:
    return await wait_for(
        op,
        what="inference server h:1",
        unavailable=Down,
        wait_s=wait_s,
        backoff=Backoff(0.5, 2.0, jitter=0.0),
        setting="model.startup_wait_s",
        clocks=Clocks(monotonic=clock.clock, sleep=clock.sleep, rng=random.Random(0)),
    )


async def test_an_unavailable_dependency_is_waited_for_with_backoff() -> None:
    clock = VirtualTime(0.0)
    calls, op = flaky(4, Down("connection refused"))
    assert await wait(op, clock) == "up"
    assert len(calls) == 5
    assert clock.slept == [0.5, 1.0, 2.0, 2.0]


async def test_other_errors_fail_at_once() -> None:
    clock = VirtualTime(0.0)
    calls, op = flaky(1, ValueError("unknown model"))
    with pytest.raises(ValueError, match="unknown model"):
        await wait(op, clock)
    assert len(calls) == 1
    assert clock.slept == []


async def test_gives_up_after_the_wait_naming_the_setting() -> None:
    clock = VirtualTime(0.0)
    calls, op = flaky(1000, Down("connection refused"))
    with pytest.raises(StillUnavailable) as caught:
        await wait(op, clock, wait_s=5.0)
    assert "inference server h:1 still unavailable after 5 s (model.startup_wait_s)" in str(
        caught.value
    )
    assert "connection refused" in str(caught.value)
    assert clock.now <= 5.0
    assert len(calls) == len(clock.slept) + 1  # one last try, then no sleep past the deadline


# --- the broker at start-up (open_source) -------------------------------------------------------


class FlakySource:
    """A source whose ``check`` raises ``errors`` one after another, then passes."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.checks = 0
        self.closed = False

    async def check(self) -> None:
        self.checks += 1
        if self.errors:
            raise self.errors.pop(0)

    async def close(self) -> None:
        self.closed = True


def kafka_settings(**fields: object) -> KafkaSettings:
    return KafkaSettings.model_validate(
        {"bootstrap_servers": "b:9092", "topic": "t", "group_id": "g", **fields}
    )


async def test_a_broker_that_does_not_answer_at_start_up_is_waited_for() -> None:
    clock = VirtualTime(0.0)
    source = FlakySource(SourceUnreachable("no answer"), SourceUnreachable("no answer"))
    await open_source(source, kafka_settings(), clocks=clocks(clock))  # type: ignore[arg-type]
    assert source.checks == 3
    assert len(clock.slept) == 2
    assert all(0 < w <= SOURCE_STARTUP_BACKOFF.max_s for w in clock.slept)
    assert not source.closed


async def test_a_broker_down_past_the_start_up_wait_is_named_and_the_source_closed() -> None:
    clock = VirtualTime(0.0)
    source = FlakySource(*[SourceUnreachable("cannot reach Kafka at b:9092")] * 50)
    with pytest.raises(StillUnavailable, match=r"source \(kafka\).*source\.startup_wait_s.*b:9092"):
        await open_source(
            source,  # type: ignore[arg-type]
            kafka_settings(startup_wait_s=20),
            clocks=clocks(clock),
        )
    assert clock.now <= 20
    assert source.checks > 1
    assert source.closed


async def test_a_wrong_source_config_is_not_waited_for() -> None:
    clock = VirtualTime(0.0)
    source = FlakySource(SourceConfigError("no topic 't'"))
    with pytest.raises(SourceConfigError, match="no topic"):
        await open_source(source, kafka_settings(), clocks=clocks(clock))  # type: ignore[arg-type]
    assert source.checks == 1
    assert clock.slept == []
    assert source.closed
