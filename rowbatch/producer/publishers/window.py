"""Many messages in flight at once: :class:`PublishWindow` bounds how many (and how many bytes)
a publisher holds unacknowledged, and reports each acknowledgement."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.messages import (
    Message,
    PublishedChunk,
    chunk_id_of,
    message_size,
    rows_of,
)


class PublishWindow:
    """Keeps up to ``max_in_flight`` messages (and ``max_bytes`` of them) being published at
    once. :meth:`submit` waits for room and raises the first failure of an earlier message;
    :meth:`drain` waits for all. ``on_done`` is called for every acknowledged message.
    Messages are handed to the publisher in submit order (a retried one may land later)."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        max_in_flight: int = 64,
        max_bytes: int = 128 * 1024 * 1024,
        on_done: Callable[[PublishedChunk], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight}")
        self._publisher = publisher
        self._max_in_flight = max_in_flight
        self._max_bytes = max_bytes
        self._on_done = on_done
        self._tasks: set[asyncio.Task[PublishedChunk]] = set()
        self._bytes = 0
        self._changed = asyncio.Event()
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    async def submit(
        self, message: Message, *, key: str | None = None, rows: int | None = None
    ) -> None:
        """Publishes ``message`` in the background once there is room. ``rows``: its rows
        for the report (default: its ``rowbatch-row-count`` header)."""
        size = message_size(message)
        while self._tasks and (
            len(self._tasks) >= self._max_in_flight or self._bytes + size > self._max_bytes
        ):
            self._check()
            self._changed.clear()
            await self._changed.wait()
        self._check()
        self._bytes += size
        count = rows_of(message) if rows is None else rows
        task = asyncio.create_task(self._publish(message, key, size, count))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _publish(
        self, message: Message, key: str | None, size: int, rows: int
    ) -> PublishedChunk:
        try:
            message_id = await self._publisher.publish(message, key=key)
        finally:
            self._bytes -= size
        return PublishedChunk(chunk_id_of(message), rows, size, message_id)

    def _finished(self, task: asyncio.Task[PublishedChunk]) -> None:
        self._tasks.discard(task)
        self._changed.set()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self._error is None:
                self._error = exc
            return
        done = task.result()
        if self._on_done is not None:
            self._on_done(done)

    async def drain(self) -> None:
        """Waits for every submitted message; raises the first failure."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        self._check()

    async def cancel(self) -> None:
        """Cancels what is still in flight (after a failure)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["PublishWindow"]
