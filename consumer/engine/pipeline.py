"""The engine: deliveries -> intake -> batcher -> inference stage -> writer stage -> ledger -> ack.

Broker-agnostic: it sees a ``Source``, a ``Sink`` and a ``run_batch`` callable (tensor building
plus inference with retries). Four kinds of tasks share one event loop:

- *intake* takes deliveries while the budget has room and nothing is backing off, decodes them
  (poison goes straight to the dead-letter topic) and queues their rows;
- the *flusher* turns queued rows into batches (full, or partial after ``max_wait``);
- *inference workers* (``max_in_flight`` of them) each keep one request at the server and hand
  the answers to the writer stage at once, so the server never waits for a sink write;
- *writers* (``write_concurrency``) take every answered batch that is waiting (up to
  ``max_write_rows``) and write them in one sink write (group commit), then settle messages
  whose rows are all written: ack, or, when any row failed for good, delete its written rows
  and dead-letter the whole message (so each row ends up in exactly one place).

A slow sink slows intake through the byte budget (answered rows stay reserved until written),
never by holding inference slots. Sink faults are handled by
:class:`consumer.engine.writer.SinkWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from consumer.engine.batcher import Batch, Batcher, Clock, Segment
from consumer.engine.budget import ByteBudget, message_cost
from consumer.engine.intake import Intake, MessageRows, PoisonMessage
from consumer.engine.ledger import Entry, Ledger
from consumer.engine.writer import SinkBackoff, SinkWriter
from consumer.observe.metrics import Metrics
from consumer.sinks.base import ResultRows, Sink
from consumer.sources.base import DeadLetterReason, Delivery, ReasonClass, SharesBudget, Source

log = logging.getLogger(__name__)

_INTAKE_YIELD_EVERY = 32
"""Intake yields to the event loop after this many messages in a row (and whenever the
budget is near full), so a source that never suspends cannot starve the other stages."""

RunBatch = Callable[[Batch], Awaitable[Mapping[str, NDArray[Any]]]]
"""Runs one batch through the model; returns model output name -> array (rows first)."""


class Isolate(Protocol):
    async def __call__(
        self, batch: Batch, run: RunBatch
    ) -> tuple[list[tuple[Batch, Mapping[str, NDArray[Any]]]], list[tuple[Segment, BaseException]]]:
        """Split a batch the server rejected into sub-batches that succeed (with their
        outputs) and single segments that fail alone."""


@dataclass(frozen=True)
class PipelineSettings:
    target_batch_size: int
    max_wait_s: float
    max_in_flight: int
    output_bytes_per_row: int
    """Expected output bytes per row, reserved in the budget with the decoded inputs."""
    outputs: Mapping[str, str]
    """Model output -> result column."""
    passthrough: tuple[str, ...]
    model_name: str
    model_version: str
    grace_s: float = 30.0
    write_concurrency: int = 2
    """Sink writes at once."""
    max_write_rows: int = 0
    """Most rows coalesced into one sink write; 0: four target batches."""
    max_write_bytes: int = 2 * 1024 * 1024
    """Batches are coalesced only while their outputs (``output_bytes_per_row`` a row) stay
    under this: a write's encoding buffers live outside the budget, so models with large
    outputs write batch by batch."""
    sink_backoff: SinkBackoff = field(default_factory=SinkBackoff)


class PipelineFailed(RuntimeError):
    """A part of the pipeline failed for good; unsettled messages were nacked."""


class Gate:
    """Open unless someone is backing off; intake waits on it. Counts nested closers."""

    def __init__(self, on_change: Callable[[bool], None]) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._closers = 0
        self._on_change = on_change

    def close(self) -> None:
        self._closers += 1
        if self._closers == 1:
            self._open.clear()
            self._on_change(False)

    def reopen(self) -> None:
        self._closers = max(0, self._closers - 1)
        if self._closers == 0 and not self._open.is_set():
            self._open.set()
            self._on_change(True)

    async def wait(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()


class Pipeline:
    def __init__(
        self,
        *,
        source: Source,
        sink: Sink,
        intake: Intake,
        run_batch: RunBatch,
        isolate: Isolate,
        is_poison: Callable[[BaseException], bool],
        settings: PipelineSettings,
        budget: ByteBudget,
        metrics: Metrics,
        clock: Clock = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._source = source
        self._sink = sink
        self._intake = intake
        self._run_batch = run_batch
        self._isolate = isolate
        self._is_poison = is_poison
        self._s = settings
        self._budget = budget
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._batcher = Batcher(settings.target_batch_size, settings.max_wait_s, clock)
        self._ledger = Ledger()
        self.gate = Gate(self._gate_changed)
        self._rows_queued = asyncio.Event()
        self._batches: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=settings.max_in_flight)
        # Unbounded: what waits here is already reserved in the byte budget.
        self._answered: asyncio.Queue[_Answered | None] = asyncio.Queue()
        self._max_write_rows = settings.max_write_rows or 4 * settings.target_batch_size
        self._writer = SinkWriter[_Answered](
            sink.write,
            build=self._result_rows,
            split=_split_by_message,
            metrics=metrics,
            backoff=settings.sink_backoff,
            on_pause=self.gate.close,
            on_resume=self.gate.reopen,
            sleep=sleep,
        )
        self._intake_done = asyncio.Event()
        metrics.budget_bytes.set(budget.limit)
        metrics.target_batch_size.set(settings.target_batch_size)

    # --- backoff hooks (passed to the inferencer and the sink writer) -----------------------

    def backoff_started(self) -> None:
        self._metrics.backoffs.inc()
        self.gate.close()

    def backoff_ended(self) -> None:
        self.gate.reopen()

    def _gate_changed(self, is_open: bool) -> None:
        self._metrics.paused.labels("backoff").set(0 if is_open else 1)
        if is_open:
            self._source.resume()
        else:
            self._source.pause()

    # --- run ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set (or the source ends), then drain within the grace
        period; what could not finish is nacked. If a part fails (a sink that keeps
        refusing writes, a bug), nothing more is acked: unsettled messages are nacked and
        ``PipelineFailed`` is raised, so the process exits and the broker redelivers."""
        workers = [
            asyncio.create_task(self._worker(), name=f"rowbatch-worker-{i}")
            for i in range(self._s.max_in_flight)
        ]
        writers = [
            asyncio.create_task(self._write_loop(), name=f"rowbatch-writer-{i}")
            for i in range(self._s.write_concurrency)
        ]
        intake = asyncio.create_task(self._intake_loop(), name="rowbatch-intake")
        flusher = asyncio.create_task(self._flush_loop(), name="rowbatch-flusher")
        stopper = asyncio.create_task(stop.wait())
        failure: BaseException | None = None
        try:
            done, _ = await asyncio.wait(
                {intake, stopper, flusher, *workers, *writers}, return_when=asyncio.FIRST_COMPLETED
            )
            broken = [t for t in done if not t.cancelled() and t.exception() is not None]
            for task in (intake, stopper):
                task.cancel()
            await asyncio.gather(intake, stopper, return_exceptions=True)
            if broken:
                failure = broken[0].exception()
                log.error("%s failed; stopping", broken[0].get_name(), exc_info=failure)
            else:
                self._intake_done.set()
                self._rows_queued.set()
                await self._drain(flusher, workers, writers)
        finally:
            for task in (flusher, *workers, *writers):
                task.cancel()
            await asyncio.gather(flusher, *workers, *writers, return_exceptions=True)
            await self._nack_unsettled()
        if failure is not None:
            raise PipelineFailed(f"the consumer stopped: {failure}") from failure

    async def _drain(
        self,
        flusher: asyncio.Task[None],
        workers: list[asyncio.Task[None]],
        writers: list[asyncio.Task[None]],
    ) -> None:
        try:
            async with asyncio.timeout(self._s.grace_s):
                await flusher
                for _ in workers:
                    await self._batches.put(None)
                await asyncio.gather(*workers)
                for _ in writers:
                    self._answered.put_nowait(None)
                await asyncio.gather(*writers)
        except TimeoutError:
            log.warning(
                "grace period of %.0f s over with %d messages unsettled; nacking them",
                self._s.grace_s,
                len(self._ledger),
            )

    async def _nack_unsettled(self) -> None:
        for entry in self._ledger.unsettled():
            self._ledger.abandon(entry.key)
            await self._settle_nack(entry)

    # --- intake ------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        # A source that reads ahead (Kafka) counts what it holds against the same budget.
        if isinstance(self._source, SharesBudget):
            self._source.share_budget(self._budget)
        taken = 0
        async for delivery in self._source.deliveries():
            self._metrics.messages_in.inc()
            try:
                rows = self._intake.rows(delivery)
            except PoisonMessage as poison:
                await self._dead_letter(delivery, poison.reason, None)
                continue
            reserve = self._cost(delivery, rows)
            try:
                await self._admit(reserve)
            except asyncio.CancelledError:
                await self._nack(delivery)
                raise
            self._accept(delivery, rows, reserve)
            # A source with a deep buffer yields without ever suspending: let the flusher,
            # the inference workers and the writers run (and release budget) meanwhile.
            taken += 1
            if taken % _INTAKE_YIELD_EVERY == 0 or not self._budget.fits(reserve):
                await asyncio.sleep(0)

    def _cost(self, delivery: Delivery, rows: MessageRows) -> int:
        """What holding this message costs until it is settled (see ``message_cost``): the
        raw payload and attributes stay held until the ack, so they count too."""
        return message_cost(
            len(delivery.payload),
            delivery.attributes,
            itertools.chain(rows.columns.values(), rows.nulls.values()),
            rows.nbytes,
            rows.rows * self._s.output_bytes_per_row,
        )

    async def _admit(self, reserve: int) -> None:
        """Wait for the gate (not backing off) and for room in the budget."""
        await self.gate.wait()
        if not self._budget.fits(reserve):
            self._metrics.paused.labels("budget").set(1)
            self._source.pause()
            try:
                await self._budget.acquire(reserve)
            finally:
                self._metrics.paused.labels("budget").set(0)
                if self.gate.is_open:
                    self._source.resume()
        else:
            await self._budget.acquire(reserve)
        self._metrics.inflight_bytes.set(self._budget.used)

    def _accept(self, delivery: Delivery, rows: MessageRows, reserve: int) -> None:
        entry = self._ledger.open(delivery, rows.chunk_id, rows.rows, reserve, self._clock())
        self._metrics.rows_in.inc(rows.rows)
        self._metrics.inflight_messages.set(len(self._ledger))
        if rows.rows == 0:
            done = self._ledger.written(entry.key, 0)
            assert done is not None
            asyncio.get_running_loop().create_task(self._settle(done))
            return
        self._batcher.add(entry.key, rows.columns, rows.nulls)
        self._rows_queued.set()

    # --- flusher -----------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            batch = self._batcher.ready()
            if batch is not None:
                await self._batches.put(batch)
                continue
            if self._intake_done.is_set():
                for rest in self._batcher.drain():
                    await self._batches.put(rest)
                return
            self._rows_queued.clear()
            deadline = self._batcher.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._rows_queued.wait()

    # --- inference workers --------------------------------------------------------------------

    async def _worker(self) -> None:
        while (batch := await self._batches.get()) is not None:
            self._metrics.inflight_batches.inc()
            try:
                answered = await self._infer(batch)
            finally:
                self._metrics.inflight_batches.dec()
            for item in answered:
                self._metrics.write_queue_batches.inc()
                self._answered.put_nowait(item)

    async def _infer(self, batch: Batch) -> list[_Answered]:
        """The batch's answers, as parts for the writer (several when poison was isolated);
        poison segments are failed here, and a batch failing for good is nacked."""
        size = len(batch)
        self._metrics.batch_size.observe(size)
        self._metrics.batch_fill.observe(size / self._s.target_batch_size)
        try:
            outputs = await self._timed_run(batch)
        except Exception as exc:
            if not self._is_poison(exc):
                log.exception("inference failed for good; nacking the batch's messages")
                await self._abandon(batch.segments)
                return []
            good, bad = await self._isolate(batch, self._timed_run)
            for segment, error in bad:
                reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, f"{error}")
                await self._fail(segment, reason)
            return [_Answered(sub, out) for sub, out in good]
        return [_Answered(batch, outputs)]

    async def _timed_run(self, batch: Batch) -> Mapping[str, NDArray[Any]]:
        started = self._clock()
        out = await self._run_batch(batch)
        self._metrics.inference_seconds.observe(self._clock() - started)
        return out

    # --- writers -----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while (first := await self._answered.get()) is not None:
            parts, rows = [first], len(first.batch)
            per_row = max(1, self._s.output_bytes_per_row)
            while (
                rows < self._max_write_rows
                and rows * per_row < self._s.max_write_bytes
                and not self._answered.empty()
            ):
                item = self._answered.get_nowait()
                if item is None:  # shutdown: write what we hold, then stop
                    self._answered.put_nowait(None)
                    break
                parts.append(item)
                rows += len(item.batch)
            try:
                await self._write(parts)
            finally:
                self._metrics.write_queue_batches.dec(len(parts))

    async def _write(self, parts: Sequence[_Answered]) -> None:
        live = [p for p in map(self._live, parts) if p is not None]
        started = self._clock()
        rejected = await self._writer.write(live)
        self._metrics.sink_seconds.observe(self._clock() - started)
        failed = {segment for part, _ in rejected for segment in part.batch.segments}
        for part, error in rejected:
            reason = DeadLetterReason(ReasonClass.REJECTED_BY_SINK, f"{error}", error.code)
            for segment in part.batch.segments:
                await self._fail(segment, reason)
        for part in live:
            for segment in part.batch.segments:
                if segment in failed or segment.message not in self._ledger:
                    continue
                done = self._ledger.written(segment.message, len(segment))
                if done is not None:
                    await self._settle(done)

    def _live(self, part: _Answered) -> _Answered | None:
        """The part without the segments of messages settled meanwhile (abandoned, or failed
        in another batch); ``None`` when nothing is left."""
        batch = part.batch
        live = [s for s in batch.segments if s.message in self._ledger]
        if len(live) == len(batch.segments):
            return part
        if not live:
            return None
        index = batch.rows_of(live)
        return _Answered(batch.select(live), {k: v[index] for k, v in part.outputs.items()})

    def _result_rows(self, parts: Sequence[_Answered]) -> ResultRows:
        batch, outputs = _merge(parts)
        entries = [self._ledger.get(s.message) for s in batch.segments]
        lengths = [len(s) for s in batch.segments]
        return ResultRows(
            chunk_id=np.repeat(np.array([e.chunk_id for e in entries], dtype=object), lengths),
            row_index=np.concatenate(
                [np.arange(s.start, s.stop, dtype=np.int64) for s in batch.segments]
            ),
            source_message_id=np.repeat(
                np.array([e.delivery.message_id for e in entries], dtype=object), lengths
            ),
            passthrough={k: batch.columns[k] for k in self._s.passthrough},
            outputs={col: outputs[out] for out, col in self._s.outputs.items()},
            nulls={k: m for k, m in batch.nulls.items() if k in self._s.passthrough},
            model_name=self._s.model_name,
            model_version=self._s.model_version,
            processed_at=datetime.fromtimestamp(self._wall(), UTC),
        )

    async def _fail(self, segment: Segment, reason: DeadLetterReason) -> None:
        if segment.message not in self._ledger:
            return
        dropped = self._batcher.discard(segment.message)
        done = self._ledger.failed(segment.message, len(segment) + dropped, reason)
        if done is not None:
            await self._settle(done)

    async def _abandon(self, segments: Sequence[Segment]) -> None:
        for segment in segments:
            if segment.message in self._ledger:
                self._batcher.discard(segment.message)
                entry = self._ledger.abandon(segment.message)
                await self._settle_nack(entry)

    # --- settling ----------------------------------------------------------------------------

    async def _settle(self, entry: Entry) -> None:
        if entry.failure is None:
            await self._source.ack(entry.delivery)
            self._metrics.messages_acked.inc()
            self._metrics.end_to_end_seconds.observe(
                max(0.0, self._wall() - entry.delivery.publish_time)
            )
        else:
            if entry.written_rows:
                await self._writer.retrying(
                    lambda: self._sink.delete_chunks([entry.chunk_id]),
                    f"delete of chunk {entry.chunk_id!r}",
                )
            await self._dead_letter(entry.delivery, entry.failure, entry.chunk_id)
        await self._release(entry)

    async def _settle_nack(self, entry: Entry) -> None:
        await self._nack(entry.delivery)
        await self._release(entry)

    async def _release(self, entry: Entry) -> None:
        await self._budget.release(entry.reserved_bytes)
        self._metrics.inflight_bytes.set(self._budget.used)
        self._metrics.inflight_messages.set(len(self._ledger))

    async def _nack(self, delivery: Delivery) -> None:
        await self._source.nack(delivery)
        self._metrics.messages_nacked.inc()

    async def _dead_letter(
        self, delivery: Delivery, reason: DeadLetterReason, chunk_id: str | None
    ) -> None:
        try:
            await self._source.dead_letter(delivery, reason)
        except Exception:
            log.exception(
                "dead-letter publish failed for message %s (chunk %s); nacking it",
                delivery.message_id,
                chunk_id,
            )
            await self._nack(delivery)
            return
        self._metrics.dead_lettered.labels(reason.reason_class.value).inc()
        log.warning(
            "dead-lettered message %s: %s: %s",
            delivery.message_id,
            reason.reason_class.value,
            reason.message,
        )


@dataclass(frozen=True, eq=False)
class _Answered:
    """A batch (or the part of one that survived poison isolation) with the model's outputs,
    waiting to be written."""

    batch: Batch
    outputs: Mapping[str, NDArray[Any]]


def _split_by_message(part: _Answered) -> list[_Answered]:
    """One part per segment (each segment is one message's rows), for bisecting a write."""
    if len(part.batch.segments) == 1:
        return [part]
    out = []
    for segment in part.batch.segments:
        index = part.batch.rows_of([segment])
        out.append(
            _Answered(part.batch.select([segment]), {k: v[index] for k, v in part.outputs.items()})
        )
    return out


def _merge(parts: Sequence[_Answered]) -> tuple[Batch, Mapping[str, NDArray[Any]]]:
    """The parts as one batch and one set of outputs (rows in part order)."""
    if len(parts) == 1:
        return parts[0].batch, parts[0].outputs
    batches = [p.batch for p in parts]
    sizes = [len(b) for b in batches]
    columns = {k: np.concatenate([b.columns[k] for b in batches]) for k in batches[0].columns}
    nulls: dict[str, NDArray[np.bool_]] = {}
    for name in {k for b in batches for k in b.nulls}:
        nulls[name] = np.concatenate(
            [b.nulls.get(name, np.zeros(n, np.bool_)) for b, n in zip(batches, sizes, strict=True)]
        )
    outputs = {k: np.concatenate([p.outputs[k] for p in parts]) for k in parts[0].outputs}
    merged = Batch(
        columns=columns,
        nulls=nulls,
        segments=tuple(s for b in batches for s in b.segments),
        oldest_at=min(b.oldest_at for b in batches),
    )
    return merged, outputs
