"""The answered batches waiting for the writers, bounded in rows.

Inference can run far ahead of a sink (a model answering ~80k rows/s, PostgreSQL writing
~32k): an unbounded queue between them filled with answers bounded only by the byte budget
(hundreds of thousands of rows at 256 MiB), all of it model work that a kill threw away and a
restart sent to the model again. Here an inference worker with an answer waits while the
queue holds ``max_rows`` (it keeps its answer, and takes no new batch meanwhile), so inference
waits for the sink instead of piling up answers; the model work a kill can lose is then at most
``max_in_flight`` batches (at the server, or answered and waiting here to be queued) plus
``max_rows`` queued plus the writes under way (:attr:`PipelineSettings.model_work_at_risk`).

An answer is always let into an empty queue, so one larger than ``max_rows`` (a partial batch
never is, but a setting might make ``max_rows`` small) cannot wait for ever. ``None`` (the
writers' stop signal) is never held back."""

from __future__ import annotations

import asyncio
from collections import deque

from rowbatch.consumer.engine.results import Answered

__all__ = ["AnsweredQueue"]


class AnsweredQueue:
    """A FIFO of answered parts (and ``None`` stop signals) holding at most ``max_rows`` rows
    (one part always fits in an empty queue)."""

    def __init__(self, max_rows: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, not {max_rows}")
        self.max_rows = max_rows
        self._items: deque[Answered | None] = deque()
        self._rows = 0
        self._not_empty = asyncio.Event()
        self._room = asyncio.Event()

    @property
    def rows(self) -> int:
        """Rows queued now."""
        return self._rows

    def __len__(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def next_rows(self) -> int:
        """Rows of the oldest item (0 for a stop signal); the queue must not be empty."""
        item = self._items[0]
        return 0 if item is None else len(item.batch)

    def _fits(self, item: Answered | None) -> bool:
        return item is None or not self._items or self._rows + len(item.batch) <= self.max_rows

    async def put(self, item: Answered | None) -> None:
        """Queues ``item``, waiting while it would take the queue past ``max_rows``."""
        while not self._fits(item):
            self._room.clear()
            await self._room.wait()
        self.put_nowait(item)

    def put_nowait(self, item: Answered | None) -> None:
        """Queues ``item`` whatever the queue holds (a stop signal, or a part put back)."""
        self._items.append(item)
        if item is not None:
            self._rows += len(item.batch)
        self._not_empty.set()

    async def get(self) -> Answered | None:
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        return self.get_nowait()

    def get_nowait(self) -> Answered | None:
        """The oldest item; raises :class:`asyncio.QueueEmpty` when there is none."""
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if item is not None:
            self._rows -= len(item.batch)
        self._room.set()
        return item
