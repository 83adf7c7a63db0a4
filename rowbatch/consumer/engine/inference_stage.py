"""The inference stage: the flusher turns queued rows into batches (full, or partial after
``max_wait``), and each inference worker keeps one batch at the model server and hands the
answers to the writers at once; rows the server rejects are isolated and failed alone, and
messages failing a batch for good (a model raising on some rows: INTERNAL) are isolated too
and nacked alone, so their batch-mates are written once and not redelivered with them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.answered_queue import AnsweredQueue
from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.poison import isolate
from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.engine.rollout_hooks import Canary, Rollout
from rowbatch.consumer.engine.row_keys import row_keys
from rowbatch.consumer.engine.settle import Settler
from rowbatch.consumer.engine.stage_context import StageContext
from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.wire.dead_letter import ReasonClass

log = logging.getLogger(__name__)


class InferenceStage:
    """Batches from the batcher (``flush``) through the model handler (``work``, one task per
    request in flight) into ``answered`` (waiting for room there: it is bounded in rows); a
    batch that fails is isolated (bisected by :func:`rowbatch.consumer.engine.poison.isolate`,
    one isolation at a time), and the messages failing for good are nacked (``settler``)."""

    def __init__(
        self,
        context: StageContext,
        *,
        settler: Settler,
        batches: asyncio.Queue[Batch | None],
        answered: AnsweredQueue,
        model: ModelHandler,
        intake_done: asyncio.Event,
        serial_isolation: bool = True,
        rollout: Rollout | None = None,
    ) -> None:
        """``rollout``: a candidate model beside ``model`` (a canary answering a share of the
        rows, or a shadow told of every answered part)."""
        self._settler = settler
        self._ledger = context.ledger
        self._batcher = context.batcher
        self._batches = batches
        self._answered = answered
        self._model = model
        self._metrics = context.telemetry.metrics
        self._rows_queued = context.rows_queued
        self._intake_done = intake_done
        self._clock = context.clocks.monotonic
        self._tracing = context.telemetry.tracing
        self.in_flight = 0
        """Requests at the model server now."""
        self._isolating: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Lock() if serial_isolation else contextlib.nullcontext()
        )
        """Held while a failed batch is bisected: one isolation at a time unless the server
        fails each request on its own rows (``[model] isolation = "concurrent"``)."""
        self._canary: tuple[Canary, InferenceStage] | None = None
        self._shadow = None if rollout is None else rollout.shadow
        if rollout is not None and rollout.canary is not None:
            candidate = InferenceStage(
                context,
                settler=settler,
                batches=batches,
                answered=answered,
                model=rollout.canary.model,
                intake_done=intake_done,
                serial_isolation=serial_isolation,
            )
            self._canary = (rollout.canary, candidate)

    async def flush(self) -> None:
        """Queue each batch as it becomes ready; once intake is done, the rest, then return."""
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

    async def work(self) -> None:
        """Run batches until a ``None`` is queued."""
        while (batch := await self._batches.get()) is not None:
            self._metrics.inflight_batches.inc()
            self.in_flight += 1
            started = self._clock()
            try:
                answered = await self._routed(batch)
            finally:
                self.in_flight -= 1
                self._metrics.inflight_batches.dec()
            if self._shadow is not None:
                self._shadowed(answered, self._clock() - started)
            for item in answered:
                self._metrics.write_queue_batches.inc()
                # Waits while the writers are a queue's worth behind (the sink is slower).
                await self._answered.put(item)

    async def _routed(self, batch: Batch) -> list[Answered]:
        """The batch's answers, from the canary's two arms when there is one."""
        if self._canary is None:
            return await self._infer(batch)
        canary, candidate = self._canary
        keys = row_keys(self._ledger, batch.segments)
        return await canary.infer(batch, keys, self._infer, candidate._infer)

    def _shadowed(self, answered: list[Answered], seconds: float) -> None:
        """The shadow told of each answered part (not error parts), with its rows' keys."""
        assert self._shadow is not None
        for part in answered:
            live = [s for s in part.batch.segments if s.message in self._ledger]
            if part.errors is None and len(live) == len(part.batch.segments):
                self._shadow(part, row_keys(self._ledger, live), seconds)

    async def _infer(self, batch: Batch) -> list[Answered]:
        """The batch's answers, as parts for the writer (several when a failure was isolated);
        poison segments are failed here, and those failing for good are nacked."""
        tracing = self._tracing
        size = len(batch)
        with tracing.inference(batch.segments, size) as span:
            parts = await self._answer(batch, size, span)
            whole = len(parts) == 1 and parts[0].batch is batch
            outcome = "answered" if whole else "isolated" if parts else "unanswered"
            tracing.answered(span, parts[0].model_version if parts else "", outcome)
            return parts

    async def _answer(self, batch: Batch, size: int, span: object) -> list[Answered]:
        self._metrics.batch_size.observe(size)
        self._metrics.batch_fill.observe(size / self._batcher.target)
        try:
            answer = await self._timed_run(batch)
        except RowsFailed as partial:
            return await self._rows_failed(batch, partial, span)
        except Exception as exc:
            inference_error = self._model.is_poison(exc) or self._model.is_fatal(exc)
            if not self._model.is_poison(exc) and (len(batch.segments) == 1 or not inference_error):
                # Failed for good alone, or not an inference error at all (a bug building the
                # request): nothing to isolate.
                log.exception("inference failed for good; nacking the batch's messages")
                await self._settler.abandon(batch.segments)
                return []
            with self._tracing.span("isolate", **{"rowbatch.messages": len(batch.segments)}):
                return await self._isolated(batch, span, exc)
        return [Answered(batch, answer.outputs, answer.model_version, span)]

    async def _isolated(self, batch: Batch, span: object, error: Exception) -> list[Answered]:
        """Bisects a failed batch: answers what succeeds, fails the poison segments, nacks
        those failing for good (a model raising on their rows may be the server's fault, so
        they are redelivered, and dead-lettered as ``too-many-attempts`` if they never pass)."""
        # One isolation at a time: a server that merges concurrent requests (MLServer's
        # adaptive batching) would fail one bisection's attempts for another's poison.
        only = batch.segments[0] if len(batch.segments) == 1 else None
        if only is not None and len(only) > 1 and self._settler.isolates_rows:
            # One message, rejected as poison: it failed alone already, so straight to its rows.
            runs = await self._isolated_rows(batch, only, error)
            return [Answered(sub, a.outputs, a.model_version, span) for sub, a in runs]
        try:
            async with self._isolating:
                found = await isolate(
                    list(batch.segments),
                    lambda segments: self._timed_run(batch.select(segments)),
                    # A part answered with rows failing alone is split too: alone, its
                    # message's rows are failed and the rest written (below).
                    lambda e: self._model.is_poison(e) or isinstance(e, RowsFailed),
                    is_fatal=self._model.is_fatal,
                    known_failure=error,  # the whole batch just failed so: not sent again
                    confirm=True,
                )
        except Exception:
            log.exception("inference failed for good; nacking the batch's messages")
            await self._settler.abandon(batch.segments)
            return []
        good = [(batch.select(segments), answer) for segments, answer in found.good]
        bad = found.bad + found.failed
        nacked: list[Segment] = []
        partial: list[Answered] = []
        for segment, failure in bad:
            if isinstance(failure, RowsFailed):
                partial += await self._rows_failed(batch.select([segment]), failure, span)
            elif not self._model.is_poison(failure):
                nacked.append(segment)
            elif len(segment) > 1 and self._settler.isolates_rows:
                good += await self._isolated_rows(batch, segment, failure)
            else:
                reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, f"{failure}")
                if self._settler.write_errors is not None:  # an error row
                    await self._settler.fail_rows(segment, reason, batch.select([segment]))
                else:
                    await self._settler.fail(segment, reason)
        if nacked:
            log.warning(
                "inference failed for good on %d of the batch's %d messages (isolated, %d "
                "answered); nacking those: %s",
                len(nacked),
                len(batch.segments),
                sum(len(sub.segments) for sub, _ in good),
                next(e for _, e in bad if not self._model.is_poison(e)),
            )
            await self._settler.abandon(nacked)
        answered = [Answered(sub, a.outputs, a.model_version, span) for sub, a in good]
        return answered + partial

    async def _isolated_rows(
        self, batch: Batch, segment: Segment, error: BaseException
    ) -> list[tuple[Batch, Answer]]:
        """Bisects a segment the server rejects on its own down to its rows (one isolation at a
        time, as for messages): the rows it rejects alone are failed as rows (dead-lettered as a
        row part of their message, the other rows written), the rest answered in the runs that
        succeeded. ``k`` bad rows among ``n`` cost at most ``2k ceil(log2 n) + k`` more
        requests (``poison.isolate`` with ``confirm``). When some rows fail for good but not as
        poison (the server may be at fault), the whole message is nacked instead."""
        alone = batch.select([segment])
        rows = [Segment(segment.message, i, i + 1) for i in range(segment.start, segment.stop)]
        split = Batch(alone.columns, alone.nulls, tuple(rows), alone.oldest_at)
        try:
            async with self._isolating:
                found = await isolate(
                    rows,
                    lambda chosen: self._timed_run(split.select(chosen)),
                    self._model.is_poison,
                    is_fatal=self._model.is_fatal,
                    known_failure=error,  # the segment alone just failed so: not sent again
                    confirm=True,
                )
        except Exception:
            log.exception("inference failed for good isolating a message's rows; nacking it")
            await self._settler.abandon([segment])
            return []
        if found.failed:
            log.warning(
                "inference failed for good on %d row(s) of a message while isolating its bad "
                "rows; nacking the message: %s",
                len(found.failed),
                found.failed[0][1],
            )
            await self._settler.abandon([segment])
            return []
        for row, rejected in found.bad:
            reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, f"{rejected}")
            await self._settler.fail_rows(row, reason, split.select([row]))
        return [(_joined(split.select(run)), answer) for run, answer in found.good]

    async def _rows_failed(self, batch: Batch, partial: RowsFailed, span: object) -> list[Answered]:
        """A batch the handler answered row by row, some rows failing on their own (an
        OpenAI-compatible server's 400 for one prompt): those rows are failed alone (their
        whole message where the source cannot dead-letter rows), the rest written; a message
        with a row whose request failed for good (``fatal``) is nacked whole. No request is
        sent again."""
        bad = partial.failed
        keep: list[Segment] = []
        index: list[NDArray[np.int64]] = []
        for segment, offset in zip(batch.segments, batch.offsets(), strict=True):
            errors = [(row, bad[row]) for row in range(offset, offset + len(segment)) if row in bad]
            if not errors:
                keep.append(segment)
                index.append(np.arange(offset, offset + len(segment), dtype=np.int64))
                continue
            if any(error.fatal for _, error in errors):
                log.warning(
                    "inference failed for good on %d row(s) of a message; nacking it: %s",
                    sum(error.fatal for _, error in errors),
                    next(error.message for _, error in errors if error.fatal),
                )
                await self._settler.abandon([segment])
                continue
            if not self._settler.isolates_rows:
                error = errors[0][1]
                reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, error.message, error.code)
                await self._settler.fail(segment, reason)
                continue
            await self._fail_rows(batch, segment, offset, errors)
            at = offset
            for row, _ in [*errors, (offset + len(segment), None)]:
                if row > at:
                    start = segment.start + at - offset
                    keep.append(Segment(segment.message, start, start + row - at))
                    index.append(np.arange(at, row, dtype=np.int64))
                at = row + 1
        if not keep:
            return []
        rows = np.concatenate(index)
        sub = Batch(
            {k: v[rows] for k, v in batch.columns.items()},
            {k: m[rows] for k, m in batch.nulls.items() if m[rows].any()},
            tuple(keep),
            batch.oldest_at,
        )
        outputs = {k: v[rows] for k, v in partial.answer.outputs.items()}
        return [Answered(sub, outputs, partial.answer.model_version, span)]

    async def _fail_rows(
        self, batch: Batch, segment: Segment, offset: int, errors: list[tuple[int, RowError]]
    ) -> None:
        """Fail ``errors``' rows of ``segment`` (positions in ``batch`` from ``offset``), one
        call per run of consecutive rows with the same code and message."""
        run: list[tuple[int, RowError]] = []
        for row, error in [*errors, (-1, None)]:
            if run and (error is None or row != run[-1][0] + 1 or error != run[0][1]):
                first = segment.start + run[0][0] - offset
                reason = DeadLetterReason(
                    ReasonClass.REJECTED_BY_MODEL, run[0][1].message, run[0][1].code
                )
                failed = Segment(segment.message, first, first + len(run))
                rows = batch.rows(run[0][0], run[-1][0] + 1, failed)
                await self._settler.fail_rows(failed, reason, rows)
                run = []
            if error is not None:
                run.append((row, error))

    async def _timed_run(self, batch: Batch) -> Answer:
        started = self._clock()
        try:
            out = await self._model.run(batch)
        except RowsFailed:  # answered, some rows failing alone: timed as answered
            self._metrics.inference_seconds.observe(self._clock() - started)
            raise
        self._metrics.inference_seconds.observe(self._clock() - started)
        return out


def _joined(batch: Batch) -> Batch:
    """``batch`` of consecutive one-row segments of one message as one segment."""
    first, last = batch.segments[0], batch.segments[-1]
    return Batch(
        batch.columns,
        batch.nulls,
        (Segment(first.message, first.start, last.stop),),
        batch.oldest_at,
    )
