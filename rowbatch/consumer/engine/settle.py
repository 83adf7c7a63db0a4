"""Settling messages with the broker: ack a message whose rows are all written, dead-letter one
with a row that failed for good (after deleting its rows already written, so each row ends up
in exactly one place; not for a source that keeps progress per row, whose dead letters go round
again in parts: ``KeepsRowProgress``), nack what cannot finish; each releases the message's
budget bytes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence

from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.ledger import Entry
from rowbatch.consumer.engine.results import Answered, error_part
from rowbatch.consumer.engine.sink_writer import SinkRetry
from rowbatch.consumer.engine.stage_context import StageContext
from rowbatch.consumer.observe.metrics import observe_many
from rowbatch.consumer.sinks.base import Sink
from rowbatch.consumer.sources.base import (
    AcksVectors,
    DeadLettersRows,
    KeepsRowProgress,
    Source,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.chunks.row_parts import row_part
from rowbatch.wire.headers.fields import H_CHUNK_ID

log = logging.getLogger(__name__)


def _by_reason(
    failed: Sequence[tuple[int, DeadLetterReason]], *, by_message: bool = False
) -> list[tuple[DeadLetterReason, list[int]]]:
    """The failed rows grouped by reason (class and code; the first message of each group
    speaks for it, unless ``by_message``: then rows of other words make other groups), each
    group's rows ascending."""
    groups: dict[tuple[str, ...], tuple[DeadLetterReason, list[int]]] = {}
    for row, reason in failed:
        key: tuple[str, ...] = (reason.reason_class.value, reason.code)
        if by_message:
            key += (reason.message,)
        groups.setdefault(key, (reason, []))[1].append(row)
    return [(reason, sorted(rows)) for reason, rows in groups.values()]


class Settler:
    """Ends each message's time in flight, through the ledger: every message the pipeline took
    is settled here exactly once (acked, dead-lettered or nacked), its budget released.

    ``sink``: where a dead-lettered message's written rows are deleted, through ``retry`` (the
    retry of the pipeline's sink writes)."""

    def __init__(
        self, context: StageContext, *, source: Source, sink: Sink, retry: SinkRetry
    ) -> None:
        self._source = source
        self._deletes_dead_letters = not isinstance(source, KeepsRowProgress)
        """Whether a dead-lettered message's written rows are deleted (see the module)."""
        self._parts_by_message = isinstance(source, KeepsRowProgress)
        """Whether failed rows of one reason but other words make other row parts: a source
        keeping its own progress per row (the table mode) writes one dead-letter line per row,
        each with its own row's words, as its halving path does."""
        telemetry = context.telemetry
        self._tracing = telemetry.tracing
        self._signal = telemetry.signal
        self._metrics = telemetry.metrics
        self._sink = sink
        self._retry = retry
        self._ledger = context.ledger
        self._batcher = context.batcher
        self._budget = context.budget
        self._wall = context.clocks.wall
        self.hold_written: Callable[[Sequence[Entry]], Awaitable[None]] | None = None
        """Where a message that its failed rows complete goes when some of its rows were
        written: a sink that stages its writes has the commit stage's ``hold`` here (its rows
        are not part of the table before the next commit, so it is settled after it); None:
        settled at once."""

        self.write_errors: Callable[[Answered], Awaitable[None]] | None = None
        """``on_row_error = "error-row"``: where rows failing on their own go as an error part
        (the write stage's queue), written with null outputs and the error columns instead of
        being dead-lettered; None: dead-lettered."""

    @property
    def dead_letters_rows(self) -> bool:
        """Whether rows that fail on their own can be dead-lettered as a row part (the source
        publishes them: ``DeadLettersRows``), the rest of their message written and acked."""
        source = self._source
        return isinstance(source, DeadLettersRows) and source.dead_letters_rows

    @property
    def isolates_rows(self) -> bool:
        """Whether rows that fail on their own cost only their rows: written as error rows
        (``write_errors``) or dead-lettered as a row part (``dead_letters_rows``); otherwise
        their whole message is dead-lettered."""
        return self.write_errors is not None or self.dead_letters_rows

    async def settle(self, entry: Entry) -> None:
        """Ack ``entry``'s message (after dead-lettering the rows that failed on their own), or
        (when it failed as a whole) delete its written rows and dead-letter it; then release
        its budget."""
        if entry.failure is None and entry.failed_rows and not await self._rows_out(entry):
            await self._settle_nack(entry)
            return
        if entry.failure is None:
            await self._source.ack(entry.delivery)
            self._metrics.messages_acked.inc()
            self._metrics.end_to_end_seconds.observe(
                max(0.0, self._wall() - entry.delivery.publish_time)
            )
            self._tracing.closed(entry.key, "acked")
        else:
            if entry.written_rows and self._deletes_dead_letters:
                await self._retry.retrying(
                    lambda: self._sink.delete_chunks([entry.chunk_id]),
                    f"delete of chunk {entry.chunk_id!r}",
                )
            await self.dead_letter(entry.delivery, entry.failure, entry.chunk_id, entry.key)
        if self._signal is not None:
            self._signal.written(entry.rows)
        await self._release(entry)

    async def settle_many(self, entries: Sequence[Entry]) -> None:
        """``settle`` each of ``entries`` (complete messages, e.g. those of one sink write):
        the acked ones in one ``ack_many`` when the source has it, with the metrics and the
        budget updated once."""
        acked = [e for e in entries if e.failure is None and not e.failed_rows]
        for entry in entries:
            if entry.failure is not None or entry.failed_rows:
                await self.settle(entry)
        if not acked:
            return
        deliveries = [e.delivery for e in acked]
        if isinstance(self._source, AcksVectors):
            await self._source.ack_many(deliveries)
        else:
            for delivery in deliveries:
                await self._source.ack(delivery)
        self._tracing.closed_many((e.key for e in acked), "acked")
        now = self._wall()
        self._metrics.messages_acked.inc(len(acked))
        observe_many(
            self._metrics.end_to_end_seconds, [max(0.0, now - d.publish_time) for d in deliveries]
        )
        if self._signal is not None:
            self._signal.written(sum(e.rows for e in acked))
        self._budget.release_now(sum(e.reserved_bytes for e in acked))
        self._metrics.inflight_bytes.set(self._budget.used)
        self._metrics.inflight_messages.set(len(self._ledger))

    async def fail(self, segment: Segment, reason: DeadLetterReason) -> None:
        """The segment's rows failed for good: its message is dead-lettered once its other
        rows are settled (rows still queued in the batcher are dropped)."""
        if segment.message not in self._ledger:
            return
        dropped = self._batcher.discard(segment.message)
        done = self._ledger.failed(segment.message, len(segment) + dropped, reason)
        if done is not None:
            await self.settle(done)

    async def fail_rows(
        self, segment: Segment, reason: DeadLetterReason, rows: Batch | None = None
    ) -> None:
        """The segment's rows failed for good on their own: written as error rows when
        ``write_errors`` is set and ``rows`` (their columns) are given, else dead-lettered as a
        row part once the message's other rows are written (the whole message where the
        source cannot), and the message acked."""
        if rows is not None and self.write_errors is not None:
            if segment.message in self._ledger:
                self._metrics.rows_errored.labels(reason.reason_class.value).inc(len(segment))
                await self.write_errors(error_part(rows, reason))
            return
        if not self.dead_letters_rows:
            await self.fail(segment, reason)
            return
        done = self._ledger.failed_rows(segment.message, segment.start, segment.stop, reason)
        if done is None:
            return
        if done.written_rows and self.hold_written is not None:
            await self.hold_written([done])
        else:
            await self.settle(done)

    async def _rows_out(self, entry: Entry) -> bool:
        """Dead-letter the rows of ``entry`` that failed on their own, one row part per
        reason; False (and logged) when a publish was not confirmed: the message is then
        nacked, redelivered, its good rows rewritten under the same keys."""
        source = self._source
        assert isinstance(source, DeadLettersRows)
        delivery = entry.delivery
        for reason, rows in _by_reason(entry.failed_rows, by_message=self._parts_by_message):
            try:
                payload, attributes = row_part(delivery.payload, delivery.attributes, rows)
                with self._tracing.dead_letter(
                    entry.key, delivery, reason.reason_class.value, reason.code, reason.message
                ):
                    await source.dead_letter_rows(delivery, payload, attributes, reason)
            except Exception:
                log.exception(
                    "dead-letter publish of %d row(s) of message %s (chunk %s) failed; nacking "
                    "the message (its written rows are rewritten under the same keys)",
                    len(rows),
                    delivery.message_id,
                    entry.chunk_id,
                )
                return False
            self._metrics.rows_dead_lettered.labels(reason.reason_class.value).inc(len(rows))
            log.warning(
                "dead-lettered %d row(s) of message %s as chunk %s (the other %d written): %s: %s",
                len(rows),
                delivery.message_id,
                attributes[H_CHUNK_ID],
                entry.rows - len(entry.failed_rows),
                reason.reason_class.value,
                reason.message,
            )
        return True

    async def abandon(self, segments: Sequence[Segment]) -> None:
        """Nack the segments' messages at once (inference failed for good)."""
        for segment in segments:
            if segment.message in self._ledger:
                self._batcher.discard(segment.message)
                entry = self._ledger.abandon(segment.message)
                await self._settle_nack(entry)

    def withdraw(self, deliveries: Collection[Delivery]) -> list[Delivery]:
        """The source takes ``deliveries`` back (their partition was revoked): drop the
        messages none of whose rows has been batched yet, out of the batcher and the ledger,
        their budget released, neither acked nor nacked; returns their deliveries. The others
        (in a request, answered or being written) finish as usual."""
        wanted = set(deliveries)
        keys = [e.key for e in self._ledger.unsettled() if e.delivery in wanted]
        dropped = [self._ledger.abandon(key) for key in self._batcher.withdraw(keys)]
        if not dropped:
            return []
        self._tracing.closed_many((e.key for e in dropped), "withdrawn")
        self._budget.release_now(sum(e.reserved_bytes for e in dropped))
        self._metrics.inflight_bytes.set(self._budget.used)
        self._metrics.inflight_messages.set(len(self._ledger))
        log.info(
            "withdrew %d message(s), %d rows, not yet sent to the model",
            len(dropped),
            sum(e.rows for e in dropped),
        )
        return [e.delivery for e in dropped]

    async def nack_unsettled(self) -> None:
        """Nack every message still in flight (shutdown, or a failed pipeline)."""
        for entry in self._ledger.unsettled():
            self._ledger.abandon(entry.key)
            await self._settle_nack(entry)

    async def nack_entries(self, entries: Sequence[Entry]) -> None:
        """Nack messages already out of the ledger (written in full, waiting for a commit
        that did not come)."""
        for entry in entries:
            await self._settle_nack(entry)

    async def _settle_nack(self, entry: Entry) -> None:
        await self.nack(entry.delivery)
        self._tracing.closed(entry.key, "nacked")
        await self._release(entry)

    async def _release(self, entry: Entry) -> None:
        await self._budget.release(entry.reserved_bytes)
        self._metrics.inflight_bytes.set(self._budget.used)
        self._metrics.inflight_messages.set(len(self._ledger))

    async def nack(self, delivery: Delivery) -> None:
        await self._source.nack(delivery)
        self._metrics.messages_nacked.inc()

    async def dead_letter(
        self,
        delivery: Delivery,
        reason: DeadLetterReason,
        chunk_id: str | None,
        key: int | None = None,
    ) -> None:
        """Publish ``delivery`` (ledger entry ``key``, ``None`` when it never entered the
        ledger) to the dead-letter topic; nack it if that fails."""
        try:
            with self._tracing.dead_letter(
                key, delivery, reason.reason_class.value, reason.code, reason.message
            ):
                await self._source.dead_letter(delivery, reason)
        except Exception:
            log.exception(
                "dead-letter publish failed for message %s (chunk %s); nacking it",
                delivery.message_id,
                chunk_id,
            )
            await self.nack(delivery)
            if key is not None:
                self._tracing.closed(key, "nacked")
            return
        self._metrics.dead_lettered.labels(reason.reason_class.value).inc()
        if key is not None:
            self._tracing.closed(key, "dead_lettered")
        log.warning(
            "dead-lettered message %s: %s: %s",
            delivery.message_id,
            reason.reason_class.value,
            reason.message,
        )
