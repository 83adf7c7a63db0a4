"""The memory budget: bytes held by everything in flight, counting decoded inputs *and* the
outputs the model will return for them. When it is full, intake stops taking messages."""

from __future__ import annotations

import asyncio


class ByteBudget:
    """An async byte semaphore. A single request larger than the whole budget is admitted when
    nothing else is held (so one huge message cannot deadlock the consumer), and is the only
    way ``used`` can exceed ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"memory budget must be > 0 bytes, got {limit}")
        self.limit = limit
        self._used = 0
        self._changed = asyncio.Condition()

    @property
    def used(self) -> int:
        return self._used

    def fits(self, n: int) -> bool:
        return self._used + n <= self.limit or self._used == 0

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` bytes fit, then hold them."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount ({n} bytes)")
        async with self._changed:
            await self._changed.wait_for(lambda: self.fits(n))
            self._used += n

    async def release(self, n: int) -> None:
        async with self._changed:
            self._used = max(0, self._used - n)
            self._changed.notify_all()
