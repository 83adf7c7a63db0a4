"""rowbatch.timing.Backoff: the one backoff every retry in rowbatch waits by (model requests,
endpoint probes, sink writes, start-up waits, publishes)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from tenacity import AsyncRetrying, stop_after_attempt

from rowbatch.timing import Backoff, BackoffWait


class ZeroRandom(random.Random):
    def random(self) -> float:
        return 0.0


class AlmostOneRandom(random.Random):
    def random(self) -> float:
        return 0.999


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(0.1, 10.0, jitter=0.5)
    waits = [backoff.wait(n, ZeroRandom()) for n in range(1, 10)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0])
    # jitter takes up to half of the wait away
    assert backoff.wait(3, AlmostOneRandom()) == pytest.approx(0.4 * (1 - 0.5 * 0.999))
    # hours of retries do not overflow
    assert backoff.wait(100_000, ZeroRandom()) == 10.0
    assert Backoff(0.1, 10.0, multiplier=1.0).wait(50, ZeroRandom()) == pytest.approx(0.1)
    assert Backoff(1.0, 1.0).wait(10_000, ZeroRandom()) == 1.0
    assert math.isfinite(Backoff(0.2, 1.0, jitter=0.0).wait(10_000, random.Random(0)))


def test_backoff_jitter_stays_in_range() -> None:
    backoff = Backoff(0.1, 10.0, jitter=1.0)
    rng = random.Random(3)
    waits = [backoff.wait(20, rng) for _ in range(1000)]
    assert 0.0 <= min(waits) < 1.0
    assert 9.0 < max(waits) <= 10.0
    half = Backoff(1.0, 1.0, jitter=0.5)
    assert all(0.5 <= half.wait(1, random.Random(s)) <= 1.0 for s in range(20))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_s": 0.0},
        {"initial_s": 5.0, "max_s": 1.0},
        {"multiplier": 0.5},
        {"jitter": 1.5},
    ],
)
def test_invalid_backoffs(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"need"):
        Backoff(**kwargs)


async def test_tenacity_waits_by_the_backoff() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    attempts = 0
    retrying = AsyncRetrying(
        wait=BackoffWait(Backoff(0.5, 1.5, jitter=0.0), ZeroRandom()),
        stop=stop_after_attempt(4),
        sleep=sleep,
        reraise=True,
    )
    with pytest.raises(RuntimeError):
        async for attempt in retrying:
            with attempt:
                attempts += 1
                raise RuntimeError("down")
    assert attempts == 4
    assert slept == [0.5, 1.0, 1.5]


def test_without_jitter_no_generator_is_needed_or_used() -> None:
    class NoRandom(random.Random):
        def random(self) -> float:
            raise AssertionError("no jitter: not drawn")

    backoff = Backoff(0.1, 2.0, jitter=0.0)
    assert [backoff.wait(n, NoRandom()) for n in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    )
    assert backoff.wait(3) == pytest.approx(0.4)
    assert 0.2 <= Backoff(0.4, 1.0, jitter=0.5).wait(1) <= 0.4  # the shared generator
