"""Time, as every part of rowbatch takes it: a ``Clock`` and a ``Sleep`` to inject (tests drive
them; production passes ``time.monotonic`` and ``asyncio.sleep``), and ``Backoff``, the one
exponential backoff with jitter used wherever something is retried (model requests, endpoint
probes, sink writes, start-up waits, publishes, and without jitter the sources' calls, pulls,
re-deliveries and reads). What differs between those is only when they
give up, which their own retry type says (``InferenceRetry``, ``PublishRetry``)."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from tenacity import RetryCallState
from tenacity.wait import wait_base

_SHARED_RNG = random.Random()  # noqa: S311 (jitter, not secrets)

Clock = Callable[[], float]
"""Monotonic seconds (``time.monotonic``)."""
Sleep = Callable[[float], Awaitable[None]]
"""``asyncio.sleep``."""
WallClock = Callable[[], float]
"""Unix seconds (``time.time``)."""


@dataclass(frozen=True)
class Clocks:
    """The time a component runs on, injected as one value: ``monotonic`` seconds for
    intervals and deadlines, ``wall`` seconds for timestamps, ``sleep`` to wait, and ``rng``
    for backoff jitter (None: a generator shared by the process, as :meth:`Backoff.wait`).
    Production takes :data:`SYSTEM_CLOCKS`; tests pass fakes."""

    monotonic: Clock = time.monotonic
    wall: WallClock = time.time
    sleep: Sleep = asyncio.sleep
    rng: random.Random | None = None


SYSTEM_CLOCKS: Final = Clocks()
"""``time.monotonic``, ``time.time``, ``asyncio.sleep`` and the shared jitter generator."""


@dataclass(frozen=True)
class Backoff:
    """The n-th wait after a failure (1-based): ``min(max_s, initial_s * multiplier**(n-1))``,
    of which the ``jitter`` fraction is random (``1.0``: anywhere from 0 to the full wait;
    ``0.0``: none)."""

    initial_s: float = 0.2
    max_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")
        if self.multiplier < 1.0 or not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"need multiplier >= 1 and 0 <= jitter <= 1: {self}")

    def wait(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``attempt``-th failure. ``rng`` draws the jitter (None: a
        generator shared by the process); without jitter it is not used, so the waits are
        exactly ``initial_s``, ``initial_s * multiplier``, ... up to ``max_s``."""
        # Cap the exponent where the wait reaches its maximum: after hours of retries
        # multiplier**n would overflow a float.
        exponent = min(max(attempt, 1) - 1, self._max_exponent)
        base = min(self.max_s, self.initial_s * self.multiplier**exponent)
        if self.jitter == 0.0:
            return float(base)
        return float(base * (1.0 - self.jitter * (rng or _SHARED_RNG).random()))

    @property
    def _max_exponent(self) -> int:
        if self.multiplier == 1.0:
            return 0
        return max(0, math.ceil(math.log(self.max_s / self.initial_s) / math.log(self.multiplier)))


class BackoffWait(wait_base):
    """``backoff`` as a tenacity wait (the n-th attempt's failure waits ``backoff.wait(n)``)."""

    def __init__(self, backoff: Backoff, rng: random.Random) -> None:
        self._backoff = backoff
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        return self._backoff.wait(retry_state.attempt_number, self._rng)
