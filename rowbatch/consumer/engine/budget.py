"""The memory budget: bytes held by everything in flight, counting what a held message really
costs (its delivery, payload and attributes, the decoded inputs, the outputs the model will
return for them, and a measured per-message overhead for the objects that keep it: the cost
model is :mod:`rowbatch.consumer.observe.costs`), plus what a source has read ahead of the
pipeline. When it is full, intake stops taking messages and the source stops reading ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ByteBudget:
    """An async byte semaphore. A single request larger than the whole budget is admitted when
    nothing else is held (so one huge message cannot deadlock the consumer), and is the only
    way ``used`` can exceed ``limit``.

    ``ahead`` is what a source holds read ahead of the pipeline (set by the source, never
    waited for): it takes room from ``acquire`` like ``used`` does. A source reads ahead only
    while there is ``room`` (``watch`` tells it when a release makes some).

    ``aside`` is set aside for what the pipeline itself holds on top of the messages' costs
    (answers being decoded, sink writes' joined batches and encode buffers: see
    :meth:`set_aside`); it takes room like ``used`` does, so ``used + ahead + aside`` stays
    within ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"memory budget must be > 0 bytes, got {limit}")
        self.limit = limit
        self._used = 0
        self._ahead = 0
        self._aside = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._watchers: list[Callable[[], None]] = []

    @property
    def used(self) -> int:
        """Bytes held by messages taken into the pipeline."""
        return self._used

    @property
    def ahead(self) -> int:
        """Bytes a source holds read ahead of the pipeline."""
        return self._ahead

    @property
    def aside(self) -> int:
        """Bytes set aside for the pipeline's own buffers (:meth:`set_aside`)."""
        return self._aside

    @property
    def room(self) -> int:
        """What is left for the pipeline and read-ahead together (negative: overdrawn)."""
        return self.limit - self._used - self._ahead - self._aside

    def fits(self, n: int) -> bool:
        return self._used + self._ahead + self._aside + n <= self.limit or self._used == 0

    def set_aside(self, n: int) -> None:
        """Hold ``n`` bytes back from messages and read-ahead, for buffers the pipeline holds
        on top of what each message is charged (at most half the budget)."""
        if not 0 <= n <= self.limit // 2:
            raise ValueError(f"can set aside 0 to half the budget ({self.limit}), not {n}")
        shrunk = n < self._aside
        self._aside = n
        if shrunk:
            self._wake()

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` bytes fit, then hold them."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount ({n} bytes)")
        while not self.fits(n):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self._used += n

    def take_now(self, n: int) -> None:
        """Hold ``n`` bytes now: ``acquire`` for a caller that has just seen them ``fits``."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount ({n} bytes)")
        self._used += n

    async def release(self, n: int) -> None:
        self.release_now(n)

    def release_now(self, n: int) -> None:
        """``release``, synchronously (for callers that must not yield to the event loop)."""
        self._used = max(0, self._used - n)
        self._wake()
        for watcher in self._watchers:
            watcher()

    def set_ahead(self, n: int) -> None:
        """The source now holds ``n`` bytes read ahead (synchronous: called from its buffer
        bookkeeping)."""
        shrunk = n < self._ahead
        self._ahead = max(0, n)
        if shrunk:
            self._wake()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every release (a source resumes reading ahead)."""
        self._watchers.append(callback)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
