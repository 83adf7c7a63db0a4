"""The pipeline's watch: every second, the age of the oldest message taken and not yet settled
(``rowbatch_oldest_unwritten_age_seconds``, from the ledger), the pipeline's state for the
scaling signal (saturated, backing off, every inference slot in use), and handing what malloc
keeps freed back to the system (``trim``, in a worker thread)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from rowbatch.consumer.engine.stage_context import StageContext

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class PipelineState:
    """What the watch reads from the stages, each a cheap call."""

    waiting_for_room: Callable[[], bool]
    """Intake holds a message and waits for the work bound or the budget."""
    backing_off: Callable[[], bool]
    in_flight: Callable[[], int]
    """Requests at the model server now."""
    max_in_flight: int
    server_saturated: Callable[[], bool] = lambda: False
    """The model servers' queues stand at their target."""


class Watch:
    """One :meth:`check` per ``interval_s`` (:meth:`run`, until cancelled)."""

    def __init__(
        self,
        context: StageContext,
        *,
        state: PipelineState,
        interval_s: float = WATCH_INTERVAL_S,
        trim: Callable[[], None] | None = None,
    ) -> None:
        """Reads the ledger and reports to the telemetry of ``context``. ``trim``: called
        every ``interval_s`` in a worker thread (it may take a few ms)."""
        self._ledger = context.ledger
        self._metrics = context.telemetry.metrics
        self._state = state
        self._signal = context.telemetry.signal
        self._clock = context.clocks.monotonic
        self._wall = context.clocks.wall
        self.interval_s = interval_s
        self._trim = trim

    def check(self) -> None:
        oldest = self._ledger.oldest_published_at()
        age = 0.0 if oldest is None else max(0.0, self._wall() - oldest)
        self._metrics.oldest_unwritten_age.set(age)
        if self._signal is not None:
            s = self._state
            self._signal.tick(
                self._clock(),
                busy=s.waiting_for_room(),
                backing_off=s.backing_off(),
                slots_full=s.in_flight() >= s.max_in_flight,
                server_saturated=s.server_saturated(),
            )

    async def run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:
                log.warning("updating the scaling signal failed", exc_info=True)
            if self._trim is not None:
                await asyncio.to_thread(self._trim)
            await asyncio.sleep(self.interval_s)
