"""A tokens-per-minute limit for hosted endpoints: a bucket of ``per_minute`` tokens refilled
continuously; a request takes its estimate (prompt bytes / 4 plus ``max_tokens``) before it is
sent and the difference to the server's ``usage`` is settled after. The clock is injected."""

from __future__ import annotations

import asyncio

from rowbatch.timing import Clock, Sleep


class TokenRate:
    def __init__(self, per_minute: int, clock: Clock, sleep: Sleep) -> None:
        self._rate = per_minute / 60.0
        self._capacity = float(per_minute)
        self._level = float(per_minute)
        self._at = clock()
        self._clock = clock
        self._sleep = sleep
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self._capacity, self._level + (now - self._at) * self._rate)
        self._at = now

    async def take(self, tokens: int) -> None:
        """Waits until ``tokens`` (at most a minute's worth) are available, then takes them."""
        want = min(float(tokens), self._capacity)
        async with self._lock:  # first come, first served
            self._refill()
            while self._level < want - 1e-6:  # a rounding shortfall is no reason to wait
                await self._sleep(max((want - self._level) / self._rate, 0.001))
                self._refill()
            self._level -= want

    def settle(self, estimated: int, used: int) -> None:
        """The server counted ``used`` where ``estimated`` was taken: give back or take more."""
        self._refill()
        self._level = min(self._capacity, self._level + estimated - used)


def estimate_tokens(text_bytes: int, max_tokens: int) -> int:
    """A request's tokens before the server counts them: ~4 bytes a token, plus the most it
    may generate."""
    return text_bytes // 4 + 1 + max_tokens
