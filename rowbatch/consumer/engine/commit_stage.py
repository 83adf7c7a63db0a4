"""The commit stage, for sinks whose writes are staged until a commit (``CommitsWrites``: the
Iceberg sink's large files): a message whose rows are all written waits here, still unacked
(its broker lease kept), until a commit makes its rows part of the table; then it is acked.

A commit is made when the oldest waiting message has waited ``interval_s``, when the sink has
``target_file_bytes`` staged, or when the waiting messages hold ``pressure_bytes`` of the memory
budget (so a full budget always ends in a commit, never a stall); and once more when the
pipeline drains (SIGTERM: the staged rows are committed, then acked). A store that cannot commit
now is retried with backoff, consumption paused meanwhile (``SinkWriter.retrying``). When the
source takes deliveries back (a Kafka rebalance), what waits is committed at once
(:meth:`CommitStage.commit_soon`), within the source's revoke grace. A source that keeps
progress per row (``KeepsRowProgress``) is told the rows a commit made part of the table
(``rows_committed``) before their messages are settled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

from rowbatch.consumer.engine.ledger import Entry
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import CommitsWrites
from rowbatch.consumer.sources.base import WrittenRows
from rowbatch.timing import SYSTEM_CLOCKS, Clocks


class CommitStage:
    def __init__(
        self,
        sink: CommitsWrites,
        *,
        retrying: Callable[[Callable[[], Awaitable[None]], str], Awaitable[None]],
        settle_many: Callable[[Sequence[Entry]], Awaitable[None]],
        interval_s: float,
        pressure_bytes: int,
        metrics: Metrics,
        clocks: Clocks = SYSTEM_CLOCKS,
        rows_committed: Callable[[Sequence[WrittenRows]], Awaitable[None]] | None = None,
    ) -> None:
        """``retrying``: the sink's retry (``SinkRetry.retrying``), through which each commit
        goes; ``settle_many``: settles the messages a commit made part of the table;
        ``clocks``: its ``monotonic`` clock and ``sleep``."""
        self._sink = sink
        self._rows_committed = rows_committed
        self._rows: list[WrittenRows] = []
        """Rows written since the last commit (told to ``rows_committed`` after it)."""
        self._retrying = retrying
        self._settle_many = settle_many
        self._interval_s = interval_s
        self._pressure_bytes = pressure_bytes
        self._metrics = metrics
        self._clock = clocks.monotonic
        self._sleep = clocks.sleep
        self._held: list[Entry] = []
        self._held_bytes = 0
        self._since: float | None = None
        self._committing: list[Entry] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._soon = False

    @property
    def waiting(self) -> int:
        """Messages written in full and not yet committed."""
        return len(self._held) + len(self._committing)

    async def hold(self, entries: Sequence[Entry]) -> None:
        """``entries`` (messages whose rows are all written) wait for the next commit."""
        if not entries:
            return
        starts = not self._held
        if starts:
            self._since = self._clock()
        self._held.extend(entries)
        self._held_bytes += sum(e.reserved_bytes for e in entries)
        self._metrics.awaiting_commit.set(self.waiting)
        if starts or self.due():  # a new wait: the committer starts its timer
            self._wake.set()

    async def hold_rows(self, written: Sequence[WrittenRows]) -> None:
        """Rows of a write (whole messages or not), told to ``rows_committed`` once the
        next commit makes them part of the table."""
        if self._rows_committed is not None:
            self._rows.extend(written)

    def commit_soon(self) -> None:
        """Commit what waits without waiting for the interval (the source is giving up some
        of its messages: a Kafka rebalance; committed and acked now, their offsets go with
        the partitions instead of being read again by the next owner)."""
        self._soon = True
        if self._held:
            self._wake.set()

    def due(self) -> bool:
        """Whether the waiting messages should be committed now."""
        if not self._held or self._since is None:
            return False
        return (
            self._soon
            or self._clock() - self._since >= self._interval_s
            or self._held_bytes >= self._pressure_bytes
            or self._sink.uncommitted_bytes() >= self._sink.target_file_bytes
        )

    async def run(self) -> None:
        """Commits whenever :meth:`due`, until cancelled."""
        while True:
            if self.due():
                await self.commit()
                continue
            self._wake.clear()
            if self._since is None:
                await self._wake.wait()
                continue
            timer = asyncio.ensure_future(
                self._sleep(max(0.0, self._since + self._interval_s - self._clock()))
            )
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({timer, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (timer, woken):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def commit(self) -> None:
        """Commits what the sink has staged, then settles the messages that were waiting when
        it began (those written meanwhile wait for the next one)."""
        async with self._lock:
            self._committing, self._held = self._held, []
            rows, self._rows = self._rows, []
            held_bytes, since = self._held_bytes, self._since
            self._held_bytes, self._since, self._soon = 0, None, False
            try:
                await self._retrying(self._sink.commit, "commit")
            except BaseException:  # still waiting: settled by a later commit, or nacked
                self._held = [*self._committing, *self._held]
                self._rows = [*rows, *self._rows]
                self._held_bytes += held_bytes
                self._since = since if since is not None else self._since
                self._committing = []
                raise
            if rows and self._rows_committed is not None:
                await self._rows_committed(rows)
            entries, self._committing = self._committing, []
            await self._settle_many(entries)
            self._metrics.awaiting_commit.set(self.waiting)

    def unsettled(self) -> list[Entry]:
        """The messages still waiting (when the pipeline stops without a final commit they
        are nacked: their rows, if a commit holds them after all, are not written twice)."""
        out, self._held, self._committing = [*self._committing, *self._held], [], []
        self._held_bytes, self._since, self._rows = 0, None, []
        self._metrics.awaiting_commit.set(0)
        return out
