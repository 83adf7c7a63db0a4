"""The write stage: each writer takes every answered batch that is waiting (up to
``max_write_rows`` rows, never past it unless one batch is larger, and ``max_write_bytes`` of
outputs) and writes them in one sink write
(group commit), then settles the messages whose rows are all written.

What a write holds besides the rows' values (the joined batch, its encode buffers:
:func:`rowbatch.consumer.engine.results.write_cost`) is taken from ``allowance``, the writers' share
of the memory budget: a write waits while the other writers hold it, and a coalesced write larger
than the whole share is split (written a part at a time)."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from rowbatch.consumer.engine.answered_queue import AnsweredQueue
from rowbatch.consumer.engine.batcher import Segment
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.ledger import Entry
from rowbatch.consumer.engine.results import Answered, write_cost
from rowbatch.consumer.engine.settle import Settler
from rowbatch.consumer.engine.sink_writer import SinkWriter
from rowbatch.consumer.engine.stage_context import StageContext
from rowbatch.consumer.sources.base import WrittenRows
from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.wire.dead_letter import ReasonClass


@dataclass(frozen=True)
class WriteLimits:
    """How much one sink write coalesces: up to ``max_rows`` rows (never past it unless one
    batch is larger), taken while their outputs (``output_bytes_per_row`` a row) are under
    ``max_bytes``."""

    max_rows: int
    max_bytes: int
    output_bytes_per_row: int


class WriteStage:
    """Writers (``write``, one task per concurrent sink write) draining ``answered`` until
    a ``None`` is queued. Sink faults are handled by the :class:`SinkWriter`."""

    def __init__(
        self,
        context: StageContext,
        *,
        settler: Settler,
        answered: AnsweredQueue,
        writer: SinkWriter[Answered],
        limits: WriteLimits,
        settle_written: Callable[[Sequence[Entry]], Awaitable[None]],
        allowance: ByteBudget | None = None,
        rows_written: Callable[[Sequence[WrittenRows]], Awaitable[None]] | None = None,
    ) -> None:
        """``settler``: fails the messages of the parts the sink rejects;
        ``settle_written``: what is done with messages whose rows are all written (the
        settler's ``settle_many`` acks them; a committing sink's
        :class:`~rowbatch.consumer.engine.commit_stage.CommitStage` holds them for its
        commit); ``allowance``: the writers' share of the memory budget, each write taking
        its :func:`~rowbatch.consumer.engine.results.write_cost` (``None``: not counted);
        ``rows_written``: told after each write which rows of which messages it wrote, before
        any of them is settled (a source that keeps progress per row, or the commit stage that
        tells it after its commit)."""
        self._answered = answered
        self._rows_written = rows_written
        self._writer = writer
        self._ledger = context.ledger
        self._settler = settler
        self._settle_written = settle_written
        self._metrics = context.telemetry.metrics
        self._max_write_rows = limits.max_rows
        self._max_write_bytes = limits.max_bytes
        self._per_row = max(1, limits.output_bytes_per_row)
        self._clock = context.clocks.monotonic
        self._allowance = allowance
        self._tracing = context.telemetry.tracing

    async def write(self) -> None:
        # Taken but not in this write (of another model version, or past the allowance):
        # written next, before anything else is taken.
        held: deque[Answered] = deque()
        while (first := held.popleft() if held else await self._answered.get()) is not None:
            parts, rows = [first], len(first.batch)
            while (
                rows * self._per_row < self._max_write_bytes
                and (held or not self._answered.empty())
                and rows + self._next_rows(held) <= self._max_write_rows
            ):
                item = held.popleft() if held else self._answered.get_nowait()
                if item is None:  # shutdown: write what we hold, then stop
                    self._answered.put_nowait(None)
                    break
                if item.model != first.model:  # one model version per write
                    held.appendleft(item)
                    break
                parts.append(item)
                rows += len(item.batch)
            try:
                await self._counted_write(parts, held)
            finally:
                self._metrics.write_queue_batches.dec(len(parts))

    def _next_rows(self, held: deque[Answered]) -> int:
        return len(held[0].batch) if held else self._answered.next_rows()

    async def _counted_write(self, parts: list[Answered], held: deque[Answered]) -> None:
        """``parts`` written, holding their cost in the allowance; parts past the whole
        allowance are left in ``held`` for the next write."""
        allowance = self._allowance
        if allowance is None:
            await self._write(parts)
            return
        while len(parts) > 1 and write_cost(parts) > allowance.limit:
            held.appendleft(parts.pop())
        cost = write_cost(parts)
        await allowance.acquire(cost)
        self._metrics.write_bytes.set(allowance.used)
        try:
            await self._write(parts)
        finally:
            allowance.release_now(cost)
            self._metrics.write_bytes.set(allowance.used)

    async def _write(self, parts: Sequence[Answered]) -> None:
        live = [p for p in map(self._live, parts) if p is not None]
        started = self._clock()
        with self._tracing.write_parts(live) as span:
            rejected = await self._writer.write(live)
            span.set_attribute("rowbatch.rejected_parts", len(rejected))
        self._metrics.sink_seconds.observe(self._clock() - started)
        # The rejected parts' segments are the live parts' segments, or rows of them (a sink
        # write bisected down to the rows: ``results.split_to_rows``).
        failed: dict[int, list[Segment]] = {}
        for part, error in rejected:
            reason = DeadLetterReason(ReasonClass.REJECTED_BY_SINK, f"{error}", error.code)
            for segment in part.batch.segments:
                failed.setdefault(segment.message, []).append(segment)
                await self._fail(segment, reason)
        done = []
        ranges: list[WrittenRows] = []
        for part in live:
            for segment in part.batch.segments:
                bad = sum(
                    len(f)
                    for f in failed.get(segment.message, ())
                    if segment.start <= f.start and f.stop <= segment.stop
                )
                if bad == len(segment) or segment.message not in self._ledger:
                    continue
                if self._rows_written is not None:  # the rows written: all but the rejected
                    held = self._ledger.get(segment.message)
                    at = segment.start
                    for f in sorted(failed.get(segment.message, ()), key=lambda f: f.start):
                        if segment.start <= f.start and f.stop <= segment.stop:
                            if f.start > at:
                                ranges += _in_message(held, at, f.start)
                            at = f.stop
                    if at < segment.stop:
                        ranges += _in_message(held, at, segment.stop)
                entry = self._ledger.written(segment.message, len(segment) - bad)
                if entry is not None:
                    done.append(entry)
        if ranges and self._rows_written is not None:
            await self._rows_written(ranges)
        await self._settle_written(done)

    async def _fail(self, segment: Segment, reason: DeadLetterReason) -> None:
        """Rows the sink rejects: as rows when they are some of their message's rows (and
        rows can be dead-lettered on their own), else the whole message."""
        entry = self._ledger.get(segment.message) if segment.message in self._ledger else None
        if entry is not None and len(segment) < entry.rows and self._settler.dead_letters_rows:
            await self._settler.fail_rows(segment, reason)
        else:
            await self._settler.fail(segment, reason)

    def _live(self, part: Answered) -> Answered | None:
        """The part without the segments of messages settled meanwhile (abandoned, or failed
        in another batch); ``None`` when nothing is left."""
        batch = part.batch
        live = [s for s in batch.segments if s.message in self._ledger]
        if len(live) == len(batch.segments):
            return part
        if not live:
            return None
        return part.take(batch.rows_of(live), batch.select(live))


def _in_message(entry: Entry, start: int, stop: int) -> list[WrittenRows]:
    """Queued rows ``[start, stop)`` of ``entry`` as ranges of its message's rows."""
    return [(entry.delivery, low, high) for low, high in entry.in_message(start, stop)]
