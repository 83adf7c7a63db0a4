"""Writing result rows through a ``Sink`` whatever the sink says back.

- ``SinkUnavailable`` (connection lost, database restarting, serialization failure, throttling):
  the same write is retried with exponential backoff for as long as the outage lasts
  (:class:`SinkRetry`, which the settler's deletes and the commit stage's commits go through
  too); the pipeline pauses consumption meanwhile (``on_pause``/``on_resume``), and nothing is
  nacked or dead-lettered for it.
- ``RowsRejected`` (a value the sink can never store): the write is bisected, first by part and
  then by message, until the parts that fail alone are found; everything else is written.
- Anything else propagates: the consumer stops (a configuration problem, or a bug).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ResultRows, RowsRejected, SinkUnavailable
from rowbatch.timing import SYSTEM_CLOCKS, Backoff, Clocks

log = logging.getLogger(__name__)

PartT = TypeVar("PartT")
T = TypeVar("T")


def _nothing() -> None:
    return None


class SinkRetry:
    """Runs an operation on the sink (a write, a delete, a commit), retried with ``backoff``
    while it raises ``SinkUnavailable``: the first failure counts a backoff period and calls
    ``on_pause``, the end of the retries ``on_resume`` (the pipeline closes and reopens its
    gate). ``clocks``: its ``sleep`` and jitter ``rng``."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        backoff: Backoff,
        on_pause: Callable[[], None] = _nothing,
        on_resume: Callable[[], None] = _nothing,
        clocks: Clocks = SYSTEM_CLOCKS,
    ) -> None:
        self._metrics = metrics
        self._backoff = backoff
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._sleep = clocks.sleep
        self._rng = clocks.rng or random.Random()  # noqa: S311 (jitter, not secrets)

    async def retrying(self, op: Callable[[], Awaitable[T]], what: str) -> T:
        """``op()``, retried with backoff while it raises ``SinkUnavailable``."""
        attempt = 0
        try:
            while True:
                try:
                    result = await op()
                except SinkUnavailable as exc:
                    attempt += 1
                    self._metrics.sink_errors.labels("unavailable").inc()
                    if attempt == 1:
                        self._metrics.backoffs.inc()
                        self._on_pause()
                    wait = self._backoff.wait(attempt, self._rng)
                    log.warning(
                        "sink unavailable (%s, attempt %d), retrying in %.2f s: %s",
                        what,
                        attempt,
                        wait,
                        exc,
                    )
                    await self._sleep(wait)
                else:
                    if attempt:
                        log.info("sink %s went through after %d failed attempt(s)", what, attempt)
                    return result
        finally:
            if attempt:
                self._on_resume()


class SinkWriter(Generic[PartT]):
    """Writes parts (units the pipeline can settle on their own, e.g. an inference batch's
    results) in one sink write, and finds the parts the sink rejects.

    ``build`` turns parts into one ``ResultRows``; ``split`` cuts one part into smaller ones
    (per message) for the bisection, returning ``[part]`` when it cannot be cut further; each
    write goes through ``retry``."""

    def __init__(
        self,
        write: Callable[[ResultRows], Awaitable[int]],
        *,
        build: Callable[[Sequence[PartT]], ResultRows],
        split: Callable[[PartT], list[PartT]],
        metrics: Metrics,
        retry: SinkRetry,
    ) -> None:
        self._write = write
        self._build = build
        self._split = split
        self._metrics = metrics
        self._retry = retry

    async def write(self, parts: Sequence[PartT]) -> list[tuple[PartT, RowsRejected]]:
        """Write ``parts``; returns the parts that the sink rejects on their own, with the
        sink's error. Every other part is durably written when this returns."""
        if not parts:
            return []
        rows = self._build(parts)
        try:
            stored = await self._retry.retrying(
                lambda: self._write(rows), f"write of {len(rows)} rows"
            )
        except RowsRejected as exc:
            self._metrics.sink_errors.labels("rejected").inc()
            if len(parts) == 1:
                finer = self._split(parts[0])
                if len(finer) == 1:
                    return [(parts[0], exc)]
                parts = finer
            half = len(parts) // 2
            return [*await self.write(parts[:half]), *await self.write(parts[half:])]
        self._metrics.rows_written.inc(stored)
        if stored < len(rows):  # already there: a redelivered or re-sent chunk
            self._metrics.rows_duplicate.inc(len(rows) - stored)
        return []
