"""The intake stage: takes deliveries from the source while the gate is open, the batcher holds
fewer rows than the pipeline's work bound and the byte budget has room, decodes them (poison
goes straight to the dead-letter topic; rows failing the value checks on their own are set
apart to be dead-lettered as a row part when the source can), opens their ledger entries and
queues their rows in the batcher. It also hands back to the source what it takes back before
it was sent to the model (``withdraw``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np

from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.decode import (
    MessageDecoder,
    MessageRows,
    PoisonMessage,
    PoisonRows,
    rows_cost,
)
from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.ledger import Entry
from rowbatch.consumer.engine.settle import Settler
from rowbatch.consumer.engine.stage_context import StageContext
from rowbatch.consumer.observe.metrics import observe_many
from rowbatch.consumer.sources.base import (
    BoundsReadAhead,
    DeliversVectors,
    SharesBudget,
    Source,
    WithdrawsDeliveries,
    WorkBound,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery

log = logging.getLogger(__name__)

_INTAKE_YIELD_EVERY = 32
"""Intake yields to the event loop after this many messages in a row (and whenever the
budget is near full), so a source that never suspends cannot starve the other stages."""


def _nothing() -> None:
    return None


class IntakeStage:
    """The one task that takes deliveries; a slow stage further on slows it through the work
    bound (rows queued and not yet batched), the budget (held until settled) and the gate
    (closed while backing off). ``rows_taken`` is set whenever rows leave the batcher.

    ``settler`` settles what intake ends itself (poison, empty messages, what it holds when
    cancelled) and drops what the source takes back; ``on_withdraw`` is called first whenever
    the source takes deliveries back (a committing sink's commit stage commits at once)."""

    def __init__(
        self,
        context: StageContext,
        *,
        settler: Settler,
        source: Source,
        decoder: MessageDecoder,
        gate: Gate,
        work: WorkBound,
        output_bytes_per_row: int,
        on_withdraw: Callable[[], None] = _nothing,
    ) -> None:
        self._settler = settler
        self._on_withdraw = on_withdraw
        self._source = source
        self._intake = decoder
        self._gate = gate
        self._budget = context.budget
        self._ledger = context.ledger
        self._batcher = context.batcher
        self._settling: set[asyncio.Task[None]] = set()
        self._metrics = context.telemetry.metrics
        self._rows_queued = context.rows_queued
        self._rows_taken = context.rows_taken
        self._work = work
        self._output_bytes_per_row = output_bytes_per_row
        self._clock = context.clocks.monotonic
        self._wall = context.clocks.wall
        self._signal = context.telemetry.signal
        self._tracing = context.telemetry.tracing
        self.waiting_for_room = False
        """Intake has a message in hand and waits for the work bound or the budget: more is
        on offer than the pipeline takes (the replica is saturated)."""
        self._admitting: Delivery | None = None
        """The delivery waiting in ``_admit`` (taken from the source, not yet in the ledger)."""
        self._admitting_withdrawn = False
        self._hand: Sequence[Delivery] = ()
        """The vector being taken; ``_at``: the index of its first delivery neither taken
        nor settled (the one in ``_admit`` included)."""
        self._at = 0
        self._withdrawn: set[Delivery] = set()
        """Deliveries of ``_hand`` the source took back before they were taken."""
        self._taken = 0

    async def run(self) -> None:
        source = self._source
        # A source that reads ahead (Kafka) counts what it holds against the same budget and
        # holds no more rows than the pipeline queues; one that can lose its deliveries to a
        # rebalance takes back what has not been sent to the model.
        if isinstance(source, SharesBudget):
            source.share_budget(self._budget)
        if isinstance(source, BoundsReadAhead):
            source.bound_read_ahead(self._work)
        if isinstance(source, WithdrawsDeliveries):
            source.on_withdraw(self.withdraw)
        vectors = (
            source.vectors()
            if isinstance(source, DeliversVectors)
            else _one_by_one(source.deliveries())
        )
        async for vector in vectors:
            await self._take(vector)

    async def _take(self, vector: Sequence[Delivery]) -> None:
        """Take one vector of deliveries, in order: each is decoded (poison dead-lettered
        alone), admitted (at once when the gate is open and the work bound and the budget
        have room, else waiting as ``_admit`` does), opened in the ledger and queued in the
        batcher. Metrics are updated once per vector; until taken, the rest of the vector
        can be withdrawn, and is nacked if intake is cancelled."""
        metrics = self._metrics
        now = self._wall()
        ages = [max(0.0, now - d.publish_time) for d in vector]
        metrics.messages_in.inc(len(vector))
        observe_many(metrics.receive_age_seconds, ages)
        budget, batcher, gate, work = self._budget, self._batcher, self._gate, self._work
        rows_in = 0
        self._hand, self._withdrawn = vector, set()
        try:
            for at, delivery in enumerate(vector):
                self._at = at
                if self._withdrawn and delivery in self._withdrawn:
                    continue
                try:
                    rows, failed = self._decoded(delivery)
                except PoisonMessage as poison:
                    self._at = at + 1  # settled by the dead letter, whatever happens
                    await self._settler.dead_letter(delivery, poison.reason, None)
                    continue
                reserve = self._cost(delivery, rows)
                if gate.is_open and batcher.pending_rows < work.rows and budget.fits(reserve):
                    budget.take_now(reserve)
                elif not await self._admit_waiting(delivery, reserve):
                    continue  # withdrawn while it waited
                entry = self._accept(delivery, rows, reserve, failed)
                if failed is not None and self._as_error_rows(failed):
                    await self._error_rows(entry, failed)
                count = rows.rows if failed is None else failed.rows
                rows_in += count
                if self._signal is not None:
                    self._signal.received(count, ages[at])
                # A source with a deep buffer yields without ever suspending: let the flusher,
                # the inference workers and the writers run (and release budget) meanwhile.
                self._taken += 1
                if self._taken % _INTAKE_YIELD_EVERY == 0 or not budget.fits(reserve):
                    self._at = at + 1
                    self._gauges()
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            for delivery in self._in_hand():
                await self._settler.nack(delivery)
            raise
        finally:
            self._hand = ()
            metrics.rows_in.inc(rows_in)
            self._gauges()

    def _decoded(self, delivery: Delivery) -> tuple[MessageRows, PoisonRows | None]:
        """The delivery's rows, or (when some of its rows fail the input checks alone and
        rows can go on their own) its other rows and the failed ones; ``PoisonMessage``."""
        try:
            return self._intake.rows(delivery), None
        except PoisonRows as some:
            if not (self._settler.dead_letters_rows or self._as_error_rows(some)):
                raise
            return some.kept, some

    def _as_error_rows(self, failed: PoisonRows | None) -> bool:
        """Whether ``failed``'s rows are written as error rows (rows that did not decode have
        nothing to write: those go as a row part)."""
        return (
            failed is not None and failed.bad is not None and self._settler.write_errors is not None
        )

    def _in_hand(self) -> list[Delivery]:
        """The deliveries of the vector being taken that are neither taken nor settled nor
        withdrawn (from the one being handled on)."""
        return [d for d in self._hand[self._at :] if d not in self._withdrawn]

    def _gauges(self) -> None:
        self._metrics.inflight_bytes.set(self._budget.used)
        self._metrics.inflight_messages.set(len(self._ledger))

    async def _admit_waiting(self, delivery: Delivery, reserve: int) -> bool:
        """``_admit`` for ``delivery``; False when it was withdrawn meanwhile (its budget is
        given back)."""
        self._admitting, self._admitting_withdrawn = delivery, False
        try:
            await self._admit(reserve)
        finally:
            self._admitting = None
        if self._admitting_withdrawn:  # the source took it back while it waited
            self._budget.release_now(reserve)
            self._metrics.inflight_bytes.set(self._budget.used)
            return False
        return True

    def _cost(self, delivery: Delivery, rows: MessageRows) -> int:
        """What holding this message costs until it is settled (see ``message_cost``): the
        raw payload and attributes stay held until the ack, so they count too; so does its
        span when tracing is on."""
        return (
            rows_cost(delivery, rows, rows.rows * self._output_bytes_per_row)
            + self._tracing.message_bytes
        )

    def withdraw(self, deliveries: Sequence[Delivery]) -> list[Delivery]:
        """The source takes ``deliveries`` back: drop those not yet sent to the model (queued
        in the batcher, waiting to be admitted, or not yet taken from the vector in hand)
        and return them."""
        self._on_withdraw()
        dropped = self._settler.withdraw(deliveries)
        wanted = set(deliveries)
        waiting = self._admitting
        if waiting is not None and not self._admitting_withdrawn and waiting in wanted:
            self._admitting_withdrawn = True
            self._withdrawn.add(waiting)
            dropped.append(waiting)
        for delivery in self._hand[self._at :]:
            if delivery in wanted and delivery not in self._withdrawn:
                self._withdrawn.add(delivery)
                dropped.append(delivery)
        return dropped

    async def _admit(self, reserve: int) -> None:
        """Wait for the gate (not backing off), for the batcher to hold fewer rows than the
        work bound (a message is always taken when fewer wait), and for room in the budget."""
        await self._gate.wait()
        while self._batcher.pending_rows >= self._work.rows:
            self._rows_taken.clear()
            self.waiting_for_room = True
            try:
                await self._rows_taken.wait()
            finally:
                self.waiting_for_room = False
        if not self._budget.fits(reserve):
            self._metrics.paused.labels("budget").set(1)
            self._source.pause()
            self.waiting_for_room = True
            try:
                await self._budget.acquire(reserve)
            finally:
                self.waiting_for_room = False
                self._metrics.paused.labels("budget").set(0)
                if self._gate.is_open:
                    self._source.resume()
        else:
            await self._budget.acquire(reserve)
        self._metrics.inflight_bytes.set(self._budget.used)

    def _accept(
        self, delivery: Delivery, rows: MessageRows, reserve: int, failed: PoisonRows | None
    ) -> Entry:
        """Open the message in the ledger and queue its rows; ``failed``: some of its rows
        failed the value checks on their own, ``rows`` holds the others. The failed ones are
        dead-lettered as a row part once the others are written or, with error rows, follow
        the others in the message's queued positions (``_error_rows`` sends them)."""
        total, keys, positions = rows.rows, rows.row_keys, None
        set_apart: tuple[tuple[int, DeadLetterReason], ...] = ()
        if failed is not None:
            total, positions = failed.rows, rows.positions
            bad = failed.bad
            if bad is not None and self._as_error_rows(failed):  # queued after the others
                assert rows.row_keys is not None and bad.row_keys is not None
                assert rows.positions is not None and bad.positions is not None
                keys = np.concatenate([rows.row_keys, bad.row_keys])
                positions = np.concatenate([rows.positions, bad.positions])
            else:
                set_apart = failed.failed
                log.warning(
                    "%d of the %d rows of message %s fail the model's input checks on their "
                    "own; they will be dead-lettered as a row part (%s)",
                    len(failed.failed),
                    failed.rows,
                    delivery.message_id,
                    failed.failed[0][1].message,
                )
        entry = self._ledger.open(
            delivery,
            rows.chunk_id,
            total,
            reserve,
            self._clock(),
            keys,
            failed_rows=set_apart,
            positions=positions,
        )
        self._tracing.opened(entry.key, delivery)
        if rows.rows == 0:
            done = self._ledger.written(entry.key, 0)
            assert done is not None
            # Nothing to infer or write: settle at once. The task is kept referenced until it
            # ends (the loop holds tasks only weakly).
            task = asyncio.get_running_loop().create_task(self._settler.settle(done))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            return entry
        self._batcher.add(entry.key, rows.columns, rows.nulls)
        self._rows_queued.set()
        return entry

    async def _error_rows(self, entry: Entry, failed: PoisonRows) -> None:
        """The rows of ``entry`` that failed the input checks, written as error rows: queued
        after its other rows (positions ``kept..rows``), one part per run of one reason."""
        bad = failed.bad
        assert bad is not None  # _as_error_rows
        kept = failed.rows - bad.rows
        rows = Batch(bad.columns, bad.nulls, (Segment(entry.key, kept, failed.rows),), 0.0)
        log.warning(
            "%d of the %d rows of message %s fail the model's input checks on their own; "
            "they are written as error rows (%s)",
            bad.rows,
            failed.rows,
            entry.delivery.message_id,
            failed.failed[0][1].message,
        )
        at = 0
        reasons = [reason for _, reason in failed.failed]
        while at < len(reasons):
            end = at + 1
            while end < len(reasons) and reasons[end] == reasons[at]:
                end += 1
            segment = Segment(entry.key, kept + at, kept + end)
            await self._settler.fail_rows(segment, reasons[at], rows.rows(at, end, segment))
            at = end


async def _one_by_one(deliveries: AsyncIterator[Delivery]) -> AsyncIterator[list[Delivery]]:
    """A source without vectors, as vectors of one delivery."""
    async for delivery in deliveries:
        yield [delivery]
