"""The engine: deliveries -> intake -> batcher -> inference stage -> writer stage -> ledger -> ack.

Broker- and server-agnostic: it sees a ``Source``, a ``Sink`` and a
:class:`rowbatch.consumer.model.handler.ModelHandler` (the chunk check, the batch run with its
retries, which errors are poison or fatal). :class:`Pipeline` wires the stages and runs their tasks
on one event loop:

- *intake* (:mod:`rowbatch.consumer.engine.intake_stage`) takes deliveries while the budget has room
and
  nothing is backing off, decodes them (poison goes straight to the dead-letter topic) and
  queues their rows;
- the *flusher* and the *inference workers* (:mod:`rowbatch.consumer.engine.inference_stage`,
  ``max_in_flight`` workers) turn queued rows into batches and keep one request each at the
  server, handing the answers to the writer stage at once, so the server never waits for a
  sink write;
- *writers* (:mod:`rowbatch.consumer.engine.write_stage`, ``write_concurrency`` of them) write every
  answered batch that is waiting in one sink write (group commit), then settle
  (:mod:`rowbatch.consumer.engine.settle`) messages whose rows are all written: ack, or, when any
  row failed for good, delete its written rows and dead-letter the whole message;
- the *watch* (:mod:`rowbatch.consumer.engine.watch`) exports every second the age of the oldest
  message not yet settled, and tells the scaling signal the pipeline's state.

Intake keeps at most ``queued_rows`` rows queued ahead of the inference workers (by default two
batches per request in flight), and tells a source that reads ahead to hold no more
(``BoundsReadAhead``); when a source takes deliveries back (a Kafka rebalance:
``WithdrawsDeliveries``), the messages none of whose rows was sent to the model are dropped at
once, so what is in hand at a rebalance is a few batches and no row is inferred twice.

A slow sink slows inference: the answered batches waiting for the writers are bounded in rows
(:class:`rowbatch.consumer.engine.answered_queue.AnsweredQueue`, one write's worth per writer),
so a worker with an answer waits for room before it takes another batch, and intake waits in
turn (its work bound, the byte budget). What a kill can throw away of the model's work is then
:attr:`PipelineSettings.model_work_at_risk` rows, whatever the budget. Sink faults are handled by
:class:`rowbatch.consumer.engine.sink_writer.SinkWriter`.

What the pipeline holds on top of each message's charge is set aside in the same budget
(:func:`pipeline_share`): the answers being decoded (a response beside its arrays, for every
request in flight) and the writers' share (joined batches and encode buffers of
``write_concurrency`` writes), and a file sink's open row groups (``BuffersFiles``, sized to
the budget), so messages, read-ahead and these together stay within it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rowbatch.consumer.engine.answered_queue import AnsweredQueue
from rowbatch.consumer.engine.batcher import Batch, Batcher
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.commit_stage import CommitStage
from rowbatch.consumer.engine.decode import MessageDecoder
from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.inference_stage import InferenceStage
from rowbatch.consumer.engine.intake_stage import IntakeStage
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.results import (
    Answered,
    ResultBuilder,
    largest_write_cost,
    split_by_message,
    split_to_rows,
)
from rowbatch.consumer.engine.rollout_hooks import Rollout
from rowbatch.consumer.engine.settle import Settler
from rowbatch.consumer.engine.sink_writer import SinkRetry, SinkWriter
from rowbatch.consumer.engine.stage_context import StageContext, Telemetry
from rowbatch.consumer.engine.watch import WATCH_INTERVAL_S, PipelineState, Watch
from rowbatch.consumer.engine.write_stage import WriteLimits, WriteStage
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.sinks.base import BuffersFiles, ColumnSpec, CommitsWrites, Sink
from rowbatch.consumer.sources.base import KeepsRowProgress, SaturatesItself, Source, WorkBound
from rowbatch.timing import SYSTEM_CLOCKS, Backoff, Clocks

__all__ = [
    "QUEUED_BATCHES_PER_REQUEST",
    "Pipeline",
    "PipelineFailed",
    "PipelineHooks",
    "PipelineSettings",
]

log = logging.getLogger(__name__)

QUEUED_BATCHES_PER_REQUEST = 2
"""Default work bound: target batches queued (and read ahead by the source) per request in
flight; enough to keep every worker's next batch ready, little to redo after a rebalance."""


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """What the pipeline runs with. The fields without a default come from the consumer's
    configuration, whose settings types declare their defaults (each once): the service builds
    this with ``rowbatch.consumer.service.runner.pipeline_settings``."""

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
    """Written with every row; ``""``: each batch's version as the server's response names it
    (servers whose metadata lists no version, e.g. MLServer)."""
    grace_s: float
    """How long a stop waits for in-flight work (``shutdown_grace_s``)."""
    write_concurrency: int
    """Sink writes at once (``[sink] write_concurrency``)."""
    max_write_rows: int
    """Most rows coalesced into one sink write; 0: four target batches
    (``[sink] max_write_rows``)."""
    sink_backoff: Backoff
    """The waits after a transient sink failure (``[sink] backoff_initial_s`` and
    ``backoff_max_s``)."""
    commit_interval_s: float | None
    """A committing sink's (Parquet, Iceberg) longest wait between commits
    (``[sink] commit_interval_s``, :mod:`rowbatch.consumer.engine.commit_stage`); None: the
    sink does not commit its writes."""
    serial_isolation: bool = True
    """One isolation (bisection of a failed batch) at a time (``[model] isolation``)."""
    error_rows: tuple[ColumnSpec, ...] | None = None
    """``[sink] on_row_error = "error-row"``: the result table's output columns (the error
    columns among them); rows failing on their own are written as error rows. None: they are
    dead-lettered."""
    max_write_bytes: int = 2 * 1024 * 1024
    """Batches are coalesced only while their outputs (``output_bytes_per_row`` a row) stay
    under this: a write's encoding buffers live outside the budget, so models with large
    outputs write batch by batch."""
    queued_rows: int = 0
    """Most rows queued for batching (taken in, not yet in a batch) before intake waits; a
    reading-ahead source holds no more than this either. 0: ``QUEUED_BATCHES_PER_REQUEST``
    target batches per request in flight. Never below one target batch."""
    watch_interval_s: float = WATCH_INTERVAL_S
    """How often the watch reports the pipeline's state (and trims memory, when it does)."""

    @property
    def work(self) -> WorkBound:
        """The bound of rows queued ahead of the inference workers."""
        rows = self.queued_rows or (
            QUEUED_BATCHES_PER_REQUEST * self.target_batch_size * self.max_in_flight
        )
        return WorkBound(
            self.target_batch_size, self.max_in_flight, max(rows, self.target_batch_size)
        )

    @property
    def write_rows(self) -> int:
        """Most rows of one sink write (``max_write_rows``, or four target batches)."""
        return self.max_write_rows or 4 * self.target_batch_size

    @property
    def write_limits(self) -> WriteLimits:
        """What one sink write coalesces (``write_rows``, ``max_write_bytes``)."""
        return WriteLimits(self.write_rows, self.max_write_bytes, self.output_bytes_per_row)

    @property
    def answered_rows(self) -> int:
        """Most answered rows queued for the writers (:class:`AnsweredQueue`): one write's
        worth per writer, so each finds a full write ready when its last one ends, and
        inference waits for the sink instead of running ahead of it."""
        return self.write_concurrency * max(self.write_rows, self.target_batch_size)

    @property
    def model_work_at_risk(self) -> int:
        """Most rows the model has answered (or is answering) that no write has made durable:
        what a kill can make a restart send to the model again. A batch per request in flight
        (at the server, or answered and waiting for room in the queue), the queue, and the
        writes under way."""
        # A write holds at most write_rows (one batch when a batch is larger): as many rows as
        # the queue holds, all writers together.
        return self.max_in_flight * self.target_batch_size + 2 * self.answered_rows


@dataclass(frozen=True)
class PipelineShare:
    """What :func:`pipeline_share` sets aside in the budget, in bytes."""

    answers: int
    """One more copy of every answer in flight while it is decoded (the response's buffers
    beside the arrays)."""
    writes: int
    """The writers' allowance: ``write_concurrency`` of the largest write's cost."""

    @property
    def total(self) -> int:
        return self.answers + self.writes


INPUT_ROW_BYTES = 128
"""Bytes of a row's input columns assumed when sizing the writers' share (a joined batch
copies them with the outputs): enough for the writes of small rows to run side by side."""


def pipeline_share(settings: PipelineSettings, limit: int) -> PipelineShare:
    """What the pipeline holds besides the messages' charges, at most half of ``limit``
    (a budget too small for both is shared between them, the writers getting at least half)."""
    per_row = settings.output_bytes_per_row
    answers = settings.max_in_flight * settings.target_batch_size * per_row
    writes = settings.write_concurrency * largest_write_cost(
        settings.write_rows,
        settings.max_write_bytes,
        settings.target_batch_size,
        per_row + INPUT_ROW_BYTES,
    )
    cap = limit // 2
    if answers + writes <= cap:
        return PipelineShare(answers, writes)
    writes = max(min(writes, cap - min(answers, cap // 2)), 1)
    return PipelineShare(max(0, min(answers, cap - writes)), writes)


class PipelineFailed(RuntimeError):
    """A part of the pipeline failed for good; unsettled messages were nacked."""


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class PipelineHooks:
    """What the pipeline is wired to in the process around it, besides its source, sink and
    model: the backoff ``gate`` it shares with the model's retries (built first, so the
    retries are given its :meth:`~Gate.backoff_started` and :meth:`~Gate.backoff_ended`), the
    ``clocks`` its stages run on, and ``trim``, which hands freed memory back to the system
    every watch interval (the service passes malloc's; None: never), and ``server_saturated``,
    whether the model servers' queues stand at their target (the scaling signal then stops
    growing), and ``rollout``, a candidate model beside the production one
    (``[model.candidate]``: a canary or a shadow)."""

    gate: Gate
    clocks: Clocks = SYSTEM_CLOCKS
    trim: Callable[[], None] | None = None
    server_saturated: Callable[[], bool] = lambda: False
    rollout: Rollout | None = None


class Pipeline:
    def __init__(
        self,
        *,
        source: Source,
        sink: Sink,
        decoder: MessageDecoder,
        model: ModelHandler,
        settings: PipelineSettings,
        budget: ByteBudget,
        telemetry: Telemetry,
        hooks: PipelineHooks,
    ) -> None:
        """``telemetry``: the metrics, the scaling signal (told of rows received and written
        and, every ``settings.watch_interval_s``, of the pipeline's state) and the spans;
        ``hooks``: the backoff gate, the clocks, the memory trim and the rollout."""
        clocks = hooks.clocks
        metrics = telemetry.metrics
        self._source = source
        self._s = settings
        self._metrics = metrics
        rows_taken = asyncio.Event()
        self._batcher = Batcher(
            settings.target_batch_size,
            settings.max_wait_s,
            clocks.monotonic,
            on_shrink=rows_taken.set,
        )
        self._ledger = Ledger()
        self.gate = hooks.gate
        self.gate.watch(self._source_follows_gate)
        rows_queued = asyncio.Event()
        self._rows_queued = rows_queued
        self._intake_done = asyncio.Event()
        self._batches: asyncio.Queue[Batch | None] = asyncio.Queue(maxsize=settings.max_in_flight)
        # Bounded in rows, so inference waits for the sink instead of running ahead of it.
        self._answered = AnsweredQueue(settings.answered_rows)
        context = StageContext(
            ledger=self._ledger,
            batcher=self._batcher,
            budget=budget,
            telemetry=telemetry,
            clocks=clocks,
            rows_queued=rows_queued,
            rows_taken=rows_taken,
        )
        results = ResultBuilder(
            self._ledger,
            outputs=settings.outputs,
            passthrough=settings.passthrough,
            model_name=settings.model_name,
            model_version=settings.model_version,
            wall=clocks.wall,
            error_rows=settings.error_rows,
        )
        # One retry for everything done to the sink (writes, deletes, commits): an outage
        # closes the gate once, whoever meets it.
        retry = SinkRetry(
            metrics=metrics,
            backoff=settings.sink_backoff,
            on_pause=self.gate.close,
            on_resume=self.gate.reopen,
            clocks=clocks,
        )
        self._settler = Settler(context, source=source, sink=sink, retry=retry)
        if settings.error_rows is not None:
            self._settler.write_errors = self._answered.put
        writer = SinkWriter[Answered](
            sink.write,
            build=results.build,
            # Down to the rows where rows can be dead-lettered on their own.
            split=split_to_rows if self._settler.dead_letters_rows else split_by_message,
            metrics=metrics,
            retry=retry,
        )
        share = pipeline_share(settings, budget.limit)
        # A file sink's open row groups, within what is left of the half that may be set aside.
        files = (
            min(sink.fit_buffers(budget.limit), max(0, budget.limit // 2 - share.total))
            if isinstance(sink, BuffersFiles)
            else 0
        )
        budget.set_aside(share.total + files)
        progress = source.rows_written if isinstance(source, KeepsRowProgress) else None
        self._commits: CommitStage | None = None
        if isinstance(sink, CommitsWrites):
            if settings.commit_interval_s is None:
                raise ValueError(f"{type(sink).__name__} commits its writes: set commit_interval_s")
            self._commits = CommitStage(
                sink,
                retrying=retry.retrying,
                settle_many=self._settler.settle_many,
                interval_s=settings.commit_interval_s,
                pressure_bytes=max(1, (budget.limit - share.total - files) // 2),
                metrics=metrics,
                clocks=clocks,
                rows_committed=progress,
            )
            self._settler.hold_written = self._commits.hold
        self._intake = IntakeStage(
            context,
            settler=self._settler,
            source=source,
            decoder=decoder,
            gate=self.gate,
            work=settings.work,
            output_bytes_per_row=settings.output_bytes_per_row,
            # A rebalance: what waits for a commit is committed at once.
            on_withdraw=_nothing if self._commits is None else self._commits.commit_soon,
        )
        self._inference = InferenceStage(
            context,
            settler=self._settler,
            batches=self._batches,
            answered=self._answered,
            model=model,
            intake_done=self._intake_done,
            serial_isolation=settings.serial_isolation,
            rollout=hooks.rollout,
        )
        self._writers = WriteStage(
            context,
            settler=self._settler,
            answered=self._answered,
            writer=writer,
            limits=settings.write_limits,
            settle_written=(
                self._settler.settle_many if self._commits is None else self._commits.hold
            ),
            allowance=ByteBudget(share.writes),
            rows_written=progress
            if self._commits is None or progress is None
            else self._commits.hold_rows,
        )
        self.watch = Watch(
            context,
            state=PipelineState(
                waiting_for_room=self._waiting_for_room,
                backing_off=lambda: not self.gate.is_open,
                in_flight=lambda: self._inference.in_flight,
                max_in_flight=settings.max_in_flight,
                server_saturated=hooks.server_saturated,
            ),
            interval_s=settings.watch_interval_s,
            trim=hooks.trim,
        )
        metrics.budget_bytes.set(budget.limit)
        metrics.read_ahead_bytes.set_function(lambda: budget.ahead)
        metrics.target_batch_size.set(settings.target_batch_size)

    def _waiting_for_room(self) -> bool:
        """The replica runs at its capacity: work waits for room in the pipeline, or a source
        that bounds itself hands out all it can."""
        if self._intake.waiting_for_room:
            return True
        return isinstance(self._source, SaturatesItself) and self._source.at_capacity()

    def _source_follows_gate(self, is_open: bool) -> None:
        """Consumption pauses while the gate is closed (something is backing off)."""
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
            asyncio.create_task(self._inference.work(), name=f"rowbatch-worker-{i}")
            for i in range(self._s.max_in_flight)
        ]
        writers = [
            asyncio.create_task(self._writers.write(), name=f"rowbatch-writer-{i}")
            for i in range(self._s.write_concurrency)
        ]
        intake = asyncio.create_task(self._intake.run(), name="rowbatch-intake")
        flusher = asyncio.create_task(self._inference.flush(), name="rowbatch-flusher")
        watch = asyncio.create_task(self.watch.run(), name="rowbatch-watch")
        committer = [
            asyncio.create_task(commits.run(), name="rowbatch-committer")
            for commits in ([self._commits] if self._commits is not None else [])
        ]
        stopper = asyncio.create_task(stop.wait())
        failure: BaseException | None = None
        try:
            done, _ = await asyncio.wait(
                {intake, stopper, flusher, *workers, *writers, *committer},
                return_when=asyncio.FIRST_COMPLETED,
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
            for task in (flusher, watch, *workers, *writers, *committer):
                task.cancel()
            await asyncio.gather(
                flusher, watch, *workers, *writers, *committer, return_exceptions=True
            )
            if self._commits is not None:
                await self._settler.nack_entries(self._commits.unsettled())
            await self._settler.nack_unsettled()
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
                    await self._answered.put(None)
                await asyncio.gather(*writers)
                if self._commits is not None:
                    await self._commits.commit()
        except TimeoutError:
            log.warning(
                "grace period of %.0f s over with %d messages unsettled; nacking them",
                self._s.grace_s,
                len(self._ledger),
            )
