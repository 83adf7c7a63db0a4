"""The intake gate: open unless some part of the pipeline (inference or the sink) is backing
off; the intake stage waits on it before taking the next delivery.

The service builds it first and hands :meth:`Gate.backoff_started` and
:meth:`Gate.backoff_ended` to the model's retries (built before the pipeline, which needs the
model), then gives it to the pipeline, which closes it for the sink writer's backoffs too and
pauses the source while it is closed (:meth:`Gate.watch`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rowbatch.consumer.observe.metrics import Metrics


class Gate:
    """Open unless someone is backing off; intake waits on it. Counts nested closers. While it
    is closed ``rowbatch_paused{why="backoff"}`` is 1."""

    def __init__(self, metrics: Metrics) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._closers = 0
        self._metrics = metrics
        self._watchers: list[Callable[[bool], None]] = []

    def watch(self, on_change: Callable[[bool], None]) -> None:
        """Call ``on_change(is_open)`` whenever the gate closes or opens."""
        self._watchers.append(on_change)

    def backoff_started(self) -> None:
        """The model server asked us to back off: counted (``rowbatch_backoff_periods``), and
        the gate closes until :meth:`backoff_ended`."""
        self._metrics.backoffs.inc()
        self.close()

    def backoff_ended(self) -> None:
        self.reopen()

    def close(self) -> None:
        self._closers += 1
        if self._closers == 1:
            self._open.clear()
            self._changed(False)

    def reopen(self) -> None:
        self._closers = max(0, self._closers - 1)
        if self._closers == 0 and not self._open.is_set():
            self._open.set()
            self._changed(True)

    def _changed(self, is_open: bool) -> None:
        self._metrics.paused.labels("backoff").set(0 if is_open else 1)
        for watcher in self._watchers:
            watcher(is_open)

    async def wait(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()
