"""Start-up waits out an unavailable dependency with backoff (injected clock and sleep), passes
any other error through at once, and gives up after the configured wait naming the setting."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from rowbatch.consumer.service.startup import StillUnavailable, wait_for
from rowbatch.timing import Backoff


class Down(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


Op = Callable[[], Awaitable[str]]


def flaky(failures: int, error: Exception) -> tuple[list[int], Op]:
    calls: list[int] = []

    async def op() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "up"

    return calls, op


async def wait(op: Op, clock: Clock, wait_s: float = 10.0) -> str:
    return await wait_for(
        op,
        what="inference server h:1",
        unavailable=Down,
        wait_s=wait_s,
        backoff=Backoff(0.5, 2.0, jitter=0.0),
        setting="model.startup_wait_s",
        sleep=clock.sleep,
        clock=clock,
        rng=random.Random(0),
    )


async def test_an_unavailable_dependency_is_waited_for_with_backoff() -> None:
    clock = Clock()
    calls, op = flaky(4, Down("connection refused"))
    assert await wait(op, clock) == "up"
    assert len(calls) == 5
    assert clock.waits == [0.5, 1.0, 2.0, 2.0]


async def test_other_errors_fail_at_once() -> None:
    clock = Clock()
    calls, op = flaky(1, ValueError("unknown model"))
    with pytest.raises(ValueError, match="unknown model"):
        await wait(op, clock)
    assert len(calls) == 1
    assert clock.waits == []


async def test_gives_up_after_the_wait_naming_the_setting() -> None:
    clock = Clock()
    calls, op = flaky(1000, Down("connection refused"))
    with pytest.raises(StillUnavailable) as caught:
        await wait(op, clock, wait_s=5.0)
    assert "inference server h:1 still unavailable after 5 s (model.startup_wait_s)" in str(
        caught.value
    )
    assert "connection refused" in str(caught.value)
    assert clock.now <= 5.0
    assert len(calls) == len(clock.waits) + 1  # one last try, then no sleep past the deadline
