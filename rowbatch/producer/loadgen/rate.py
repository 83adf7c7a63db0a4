"""Pacing the load generator to a rate of rows per second, on an injectable clock."""

from __future__ import annotations

import asyncio
import time

from rowbatch.timing import Clock, Sleep


class RateLimiter:
    """Paces rows to ``rate`` rows/s on average (None: no limit). ``clock`` and ``sleep`` are
    injectable; after falling behind by more than ``max_lag_s`` it does not burst to catch up."""

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        max_lag_s: float = 1.0,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 rows/s or None, not {rate}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._max_lag_s = max_lag_s
        self._start: float | None = None
        self._sent = 0.0

    async def acquire(self, rows: int) -> None:
        """Waits until ``rows`` more rows may go."""
        if self.rate is None:
            return
        now = self._clock()
        if self._start is None:
            self._start = now
        due = self._start + self._sent / self.rate
        if due > now:
            await self._sleep(due - now)
        elif now - due > self._max_lag_s:
            self._start = now - self._sent / self.rate  # behind: pace from here on
        self._sent += rows


__all__ = ["RateLimiter"]
