"""Admission from the server's own queue, for Open Inference Protocol servers: each endpoint's
requests in flight follow what its server says of its queue (Triton's model statistics, read
every ``interval_s`` over the channel the consumer holds), so the server's queue stays near a
target while its instances stay busy, whatever the number of consumers that share it. The
configured or derived in-flight limit (``model.max_in_flight``) is the ceiling.

The target, in requests: ``target_queue_ratio`` x the server's slots, the most requests it
was seen running at once on average (its instances times what each execution takes): with
the default 1.0 each request waits about one execution before its own, so the next execution
of every instance is ready when the last ends, and no more. The controller is the one the
OpenAI-compatible endpoints use (:class:`rowbatch.consumer.model.window.Window`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rowbatch.consumer.model.server_stats import QueueReading, QueueTotals
from rowbatch.consumer.model.window import Window

log = logging.getLogger(__name__)


BUSY = 0.9
"""The share of its slots a server runs, on average, to count as full."""


@dataclass(frozen=True)
class AdmissionSettings:
    """How an endpoint's window reads its server (from ``[model]``)."""

    interval_s: float = 0.5
    target_queue_ratio: float = 1.0


@runtime_checkable
class StatsClient(Protocol):
    """An endpoint client that reads its server's statistics
    (:meth:`rowbatch.consumer.model.inference.client.InferenceClient.queue_totals`)."""

    async def queue_totals(self, at: float, client_timeout: float = 2.0) -> QueueTotals | None: ...


class QueueMeter(Protocol):
    """Where a reading is reported (:class:`rowbatch.consumer.observe.metrics.EndpointMetrics`)."""

    def server_waiting(self, requests: float) -> None: ...

    def server_queue_seconds(self, seconds: float) -> None: ...

    def saturated(self, full: bool) -> None: ...


@dataclass
class QueueFollower:
    """Turns one server's successive totals into readings of its queue for ``window``."""

    window: Window
    meter: QueueMeter
    target_queue_ratio: float = 1.0
    slots: float = 0.0
    """The most requests the server was seen running, on (moving) average: one reading over
    a few hundred milliseconds counts a few requests, so a single one overstates it."""
    running: float | None = field(default=None, init=False)
    """The moving average of the requests running (the window's ``smoothing``)."""
    last: QueueTotals | None = field(default=None, init=False)
    reading: QueueReading | None = field(default=None, init=False)

    @property
    def saturated(self) -> bool:
        """The server runs full and requests wait there: its slots were busy (at least
        :data:`BUSY` of them, on average) with a queue of half a request or more. More
        requests, from this consumer or another, would only wait."""
        queue, running = self.window.queue, self.running
        if queue is None or running is None:
            return False
        return running >= BUSY * self.slots and queue >= 0.5

    def totals(self, totals: QueueTotals) -> None:
        """The server's totals now: the window follows the queue since the last ones."""
        before, self.last = self.last, totals
        reading = None if before is None else QueueReading.between(before, totals)
        if reading is None:
            return
        self.reading = reading
        running = self.running
        running = (
            reading.running
            if running is None
            else (running + self.window.smoothing * (reading.running - running))
        )
        self.running = running
        self.slots = max(self.slots, running)
        target = self.target_queue_ratio * max(self.slots, 1.0)
        in_server = reading.waiting + reading.running
        share_of = min(1.0, self.window.in_use / in_server) if in_server > 0 else 1.0
        self.window.follow(reading.waiting, share_of, totals.at, target)
        log.debug(
            "server queue %.2f (average %.2f), running %.2f over %.2f s (%d requests), target "
            "%.1f, share %.2f: window %d, %d in flight",
            reading.waiting,
            self.window.queue or 0.0,
            reading.running,
            reading.seconds,
            reading.requests,
            target,
            share_of,
            self.window.limit,
            self.window.in_use,
        )
        self.meter.server_waiting(reading.waiting)
        self.meter.server_queue_seconds(reading.queue_s)
        self.meter.saturated(self.saturated)


__all__ = ["AdmissionSettings", "QueueFollower", "QueueMeter", "StatsClient"]
