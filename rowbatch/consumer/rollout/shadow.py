"""A shadow: the rows production answered (all, or the share their keys place below it) are
sent to the candidate too, and both answers land in the comparison table. The production path
never waits for it: :meth:`Shadow.offer` copies the rows and returns, a backlog past its bound
(rows, and bytes: its share of the memory budget) is skipped and counted, the candidate's
requests run on their own tasks (as many as its servers take), with their own timeout and no
retry, and a failure is written as the candidate's error or, when the comparison table refuses
it, counted and dropped. The comparison is a sample for judging the candidate; the promise of
exactly once holds for the result table alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.engine.row_keys import RowKeys
from rowbatch.consumer.model.candidate import CandidateSettings
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.rollout.comparison import ComparisonLayout, Shadowed, agreeing
from rowbatch.consumer.rollout.metrics import RolloutMetrics
from rowbatch.consumer.sinks.base import Sink
from rowbatch.timing import SYSTEM_CLOCKS, Clocks

log = logging.getLogger(__name__)


class _Rows:
    """Shadowed rows as the candidate's handler takes them (``BatchRows``)."""

    def __init__(self, shadowed: Shadowed) -> None:
        self.columns = shadowed.columns
        self.nulls = shadowed.nulls
        self._n = len(shadowed)

    def __len__(self) -> int:
        return self._n


class Shadow:
    def __init__(
        self,
        table: Sink,
        *,
        settings: CandidateSettings,
        layout: ComparisonLayout,
        metrics: RolloutMetrics,
        max_bytes: int,
        clocks: Clocks = SYSTEM_CLOCKS,
    ) -> None:
        """``table``: the comparison table's sink, opened; ``max_bytes``: the most the
        backlog holds (its budget share). Rows are skipped until :meth:`run` is given the
        candidate."""
        self._candidate: ModelHandler | None = None
        self._table = table
        self._s = settings
        self._layout = layout
        self._metrics = metrics
        self._max_bytes = max_bytes
        self._clocks = clocks
        self._queue: asyncio.Queue[Shadowed] = asyncio.Queue()
        self._rows = 0
        self._bytes = 0
        self._write_lock = asyncio.Lock()

    @property
    def backlog_rows(self) -> int:
        return self._rows

    def offer(self, part: Answered, keys: RowKeys, seconds: float) -> None:
        """Take a copy of the part's rows in the share (``keys``: theirs), unless the backlog
        is full (skipped and counted): never waits."""
        self._metrics.counted("production", "answered", len(part.batch))
        self._metrics.timed("production", seconds)
        if self._s.fraction >= 1.0:  # every row: no hashing
            index = np.arange(len(part.batch))
        else:
            places = key_places(keys.chunk_ids, keys.lengths, keys.row_index, self._s.salt)
            index = np.flatnonzero(in_share(places, self._s.fraction))
        if index.size == 0:
            return
        batch = part.batch
        if self._candidate is None or self._rows + index.size > self._s.backlog_rows:
            self._metrics.counted("candidate", "skipped", int(index.size))
            return
        shadowed = Shadowed(
            chunk_id=keys.per_row(keys.chunk_ids)[index],
            row_index=keys.row_index[index],
            message_id=keys.per_row(keys.message_ids)[index],
            columns={k: v[index] for k, v in batch.columns.items()},
            nulls={k: m[index] for k, m in batch.nulls.items() if m[index].any()},
            production={k: v[index] for k, v in part.outputs.items()},
            production_version=part.model_version,
            latency_s=seconds,
        )
        if self._bytes + shadowed.nbytes > self._max_bytes and self._rows:
            self._metrics.counted("candidate", "skipped", len(shadowed))
            return
        self._rows += len(shadowed)
        self._bytes += shadowed.nbytes
        self._metrics.backlog.set(self._rows)
        self._queue.put_nowait(shadowed)

    async def run(self, candidate: ModelHandler, requests: int) -> None:
        """``requests`` of ``candidate``'s at once, until cancelled; what is left then is
        dropped (counted)."""
        self._candidate = candidate
        tasks = [
            asyncio.create_task(self._work(candidate), name=f"rowbatch-shadow-{i}")
            for i in range(requests)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._metrics.counted("candidate", "dropped", self._rows)
            self._rows = self._bytes = 0
            self._metrics.backlog.set(0)

    async def _work(self, candidate: ModelHandler) -> None:
        while True:
            shadowed = await self._queue.get()
            compared = False
            try:
                await self._compare(candidate, shadowed)
                compared = True
            finally:
                if not compared:  # cancelled: the consumer stops
                    self._metrics.counted("candidate", "dropped", len(shadowed))
                self._rows -= len(shadowed)
                self._bytes -= shadowed.nbytes
                self._metrics.backlog.set(self._rows)

    async def _compare(self, candidate: ModelHandler, shadowed: Shadowed) -> None:
        clock = self._clocks.monotonic
        started = clock()
        outputs: Mapping[str, NDArray[Any]] | None = None
        version, error = "", None
        try:
            async with asyncio.timeout(self._s.timeout_s):
                answer = await candidate.run(_Rows(shadowed))
            outputs, version = answer.outputs, answer.model_version
        except TimeoutError:
            error = f"no answer within model.candidate.timeout_s ({self._s.timeout_s:g} s)"
        except Exception as exc:  # noqa: BLE001  # the candidate's failure, never production's
            error = f"{type(exc).__name__}: {exc}"
        seconds = clock() - started
        self._metrics.timed("candidate", seconds)
        n = len(shadowed)
        if outputs is None:
            self._metrics.counted("candidate", "failed", n)
        else:
            self._metrics.counted("candidate", "answered", n)
            self._count_agreement(shadowed, outputs)
        rows = self._layout.rows(
            shadowed,
            outputs,
            version=version,
            seconds=seconds,
            error=error,
            at=self._clocks.wall(),
        )
        try:
            async with self._write_lock:
                await self._table.write(rows)
        except Exception as exc:  # noqa: BLE001  # a sample lost, counted: never fatal
            self._metrics.counted("candidate", "unwritten", n)
            log.warning("the comparison table refused %d shadowed rows (dropped): %s", n, exc)

    def _count_agreement(self, shadowed: Shadowed, outputs: Mapping[str, NDArray[Any]]) -> None:
        for out, column in self._layout.outputs.items():
            same = int(agreeing(shadowed.production[out], outputs[out]).sum())
            self._metrics.agreement.labels(column, "true").inc(same)
            self._metrics.agreement.labels(column, "false").inc(len(shadowed) - same)


async def close_quietly(table: Sink) -> None:
    """The comparison table's sink closed, its failure logged (it never stops the
    consumer)."""
    try:
        await table.close()
    except Exception:
        log.exception("closing the comparison table failed")
