"""The Kafka source's read-ahead: the poll task that fetches records into a local buffer,
the nacked records waiting to be yielded again, what they cost, when fetching must pause, and
how many records the next fetch may ask for.

Backpressure: ``pause()`` (the model server backing off) pauses every assigned partition with
``consumer.pause`` and stops yielding; the poll task keeps calling ``getmany`` (which then
returns nothing after its timeout). The read-ahead is counted at what it really costs (each
record's key, value and headers plus ``RECORD_OVERHEAD_BYTES`` and ``HEADER_OVERHEAD_BYTES`` per
header, measured) and bounded by ``max_buffered_records``/``max_buffered_bytes`` and, once the
pipeline shares its byte budget with the source (``share_budget``), by that budget: the
read-ahead is held in it (``ByteBudget.ahead``), so what the pipeline holds plus what the
source holds stays within one limit, the read-ahead takes at most ``READ_AHEAD_SHARE`` (a
quarter) of it, and a fetch asks for no more records than the room left can hold (at the mean
cost seen so far). It is also bounded in rows of work (``max_buffered_rows``, by default the
pipeline's ``WorkBound``: two target batches per request in flight), so what this member holds
when a rebalance takes its partitions is a batch or two, not the backlog: a fetch asks for no
more records than the rows left fit (at the mean rows per record seen; one record for the
first fetch).

When any of these bounds is reached (the buffer is **full**), the poll task waits for the
pipeline to take a record (or for room in the budget) instead of fetching. It does not pause
the partitions for that: aiokafka drops the records it prefetched for a paused partition and
fetches them again after ``resume`` (its position does not move), so pausing at every full
buffer fetched the same bytes again many times a second (a drain of 1-row messages received
~3.6x their bytes from the broker and spent ~10 % of the consumer's CPU parsing them again).
aiokafka's own prefetch is bounded anyway (one response per partition at a time, at most
``fetch_max_bytes``). Only when the buffer stays full for ``STALL_S`` (the pipeline is
stalled) are the partitions paused, so that ``getmany`` can go on being called (group
membership) without taking more records; they are resumed once the buffer has drained to half
(and the read-ahead has half its share of room again).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError

from rowbatch.consumer.sources.base import READ_AHEAD_SHARE, SharedBudget
from rowbatch.consumer.sources.kafka.records import Held, work_rows
from rowbatch.consumer.sources.kafka.settings import KafkaSettings

_LOG = logging.getLogger(__name__)

STALL_S = 1.0
"""How long the buffer may stay full before fetching is paused (see above)."""

_POLL_TIMEOUT_MS = 200
_MIN_POLL_PERIOD_S = 0.05


class ReadAhead:
    """What the source holds and has not yielded, and whether fetching is paused.

    ``started_consumer()`` returns the aiokafka consumer once it is started (else None): its
    partitions are paused and resumed here."""

    def __init__(self, config: KafkaSettings, started_consumer: Callable[[], Any | None]) -> None:
        self._config = config
        self._started_consumer = started_consumer
        self.buffer: deque[Held] = deque()
        """Fetched, not yet yielded, in fetch order."""
        self.buffered_bytes = 0  # what the buffered records cost (``Held.cost``)
        self.buffered_rows = 0  # the rows of work they carry (``work_rows``)
        self.max_rows = config.max_buffered_rows
        """The rows bound (None: none yet; see ``bound``)."""
        self.stall_s = STALL_S
        self.stalled = False
        """The buffer stayed full for ``stall_s``: fetching is paused."""
        self._room = asyncio.Event()
        """Set when records leave the buffer."""
        self.retries: list[tuple[float, int, Held]] = []
        """Nacked records waiting to be yielded again: (due, seq, held), a heap."""
        self.retry_bytes = 0
        self._retry_seq = itertools.count()
        self.budget: SharedBudget | None = None
        """The pipeline's budget, once shared: the read-ahead is held in it."""
        self.paused = False
        """The pipeline paused the source: nothing is yielded, fetching is paused."""
        self.fetch_paused = False
        self.records_seen = 0
        self.rows_seen = 0
        self.cost_seen = 0

    @property
    def bytes(self) -> int:
        """What the buffered and retry-waiting records cost."""
        return self.buffered_bytes + self.retry_bytes

    @property
    def rows_per_record(self) -> float:
        """The mean rows per record seen so far (1 before any)."""
        return self.rows_seen / self.records_seen if self.records_seen else 1.0

    @property
    def busy(self) -> bool:
        return bool(self.buffer or self.retries)

    def bound(self, rows: int) -> None:
        """The pipeline's work bound, in rows: the buffer holds no more (unless
        ``max_buffered_rows`` is configured, which wins)."""
        if self._config.max_buffered_rows is None:
            self.max_rows = max(1, rows)
        self._room.set()
        self.update_fetch_pause()

    def rows_full(self) -> bool:
        return self.max_rows is not None and self.buffered_rows >= self.max_rows

    def full(self) -> bool:
        """No room to read further ahead: in rows, records or bytes, or in the budget."""
        cfg = self._config
        return (
            self.rows_full()
            or len(self.buffer) >= cfg.max_buffered_records
            or self.buffered_bytes >= cfg.max_buffered_bytes
            or (self.budget is not None and self.budget_room() <= 0)
        )

    def share(self, budget: SharedBudget) -> None:
        self.budget = budget
        budget.watch(self._budget_changed)
        self.report()
        self.update_fetch_pause()

    async def fetch(
        self,
        consumer: Any,
        received: Callable[[TopicPartition, Iterable[Any]], list[Held]],
        *,
        closed: Callable[[], bool],
        fetched: Callable[[], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        """The poll task: ``getmany`` into the buffer until ``closed()``, taking what
        ``received(tp, records)`` returns of each fetch and calling ``fetched()`` after each
        that added records. An error aiokafka does not recover from goes to ``fail`` and
        ends it."""
        loop = asyncio.get_running_loop()
        while not closed():
            if self.full() and not self.paused and await self._wait_for_room():
                continue
            started = loop.time()
            try:
                batches = await consumer.getmany(
                    timeout_ms=_POLL_TIMEOUT_MS, max_records=self.poll_records()
                )
            except ConsumerStoppedError:
                return
            except KafkaError as exc:
                if exc.retriable:
                    _LOG.warning("Kafka fetch failed, retrying: %r", exc)
                    await asyncio.sleep(0.5)
                    continue
                fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - reported to the iterator, not lost
                fail(exc)
                return
            if self.take(batches, received):
                self.update_fetch_pause()
                fetched()
            elif loop.time() - started < _MIN_POLL_PERIOD_S:
                await asyncio.sleep(_MIN_POLL_PERIOD_S)

    async def _wait_for_room(self) -> bool:
        """Wait up to ``stall_s`` for the pipeline to take records out of a full buffer (or
        to free room in the budget); False when it did not (then fetching is paused, see the
        module docstring)."""
        try:
            async with asyncio.timeout(self.stall_s):
                while self.full():
                    self._room.clear()
                    await self._room.wait()
        except TimeoutError:
            self.stalled = True
            self.update_fetch_pause()
            return False
        return True

    def take(
        self,
        batches: Mapping[TopicPartition, list[Any]],
        received: Callable[[TopicPartition, Iterable[Any]], list[Held]],
    ) -> int:
        """Buffer what ``received`` returns of each partition's records; returns how many."""
        added = 0
        for tp, records in batches.items():
            for held in received(tp, records):
                self.add(held)
                added += 1
        if added:
            self.report()
        return added

    def add(self, held: Held) -> None:
        """A fetched record (call ``report`` once the fetch is taken)."""
        self.records_seen += 1
        self.rows_seen += held.rows
        self.cost_seen += held.cost
        self.buffer.append(held)
        self.buffered_bytes += held.cost
        self.buffered_rows += work_rows(held)

    def retry(self, held: Held, due: float) -> None:
        """A nacked record, to be yielded again at ``due`` (monotonic)."""
        heapq.heappush(self.retries, (due, next(self._retry_seq), held))
        self.retry_bytes += held.cost
        self.report()

    def next_due(self) -> float | None:
        return self.retries[0][0] if self.retries else None

    def pop_ready(self, now: float, current: Callable[[Held], bool]) -> Held | None:
        """The next record to yield: a retry that is due, else the oldest buffered one;
        records that are not ``current`` (their partition was revoked) are dropped."""
        while self.retries and self.retries[0][0] <= now:
            held = heapq.heappop(self.retries)[2]
            self.retry_bytes -= held.cost
            self.report()
            if current(held):
                return held
        while self.buffer:
            held = self.buffer.popleft()
            self.buffered_bytes -= held.cost
            self.buffered_rows -= work_rows(held)
            self._room.set()
            self.report()
            self.update_fetch_pause()
            if current(held):
                return held
        return None

    def pop_ready_many(self, now: float, current: Callable[[Held], bool], limit: int) -> list[Held]:
        """Up to ``limit`` records to yield, as ``pop_ready`` would return them one by one
        (due retries first, then the buffer in fetch order), with the bookkeeping (budget
        report, rows room, fetch pause) done once."""
        out: list[Held] = []
        retries = self.retries
        while retries and retries[0][0] <= now and len(out) < limit:
            held = heapq.heappop(retries)[2]
            self.retry_bytes -= held.cost
            if current(held):
                out.append(held)
        buffer = self.buffer
        popped = cost = rows = 0
        while buffer and len(out) < limit:
            held = buffer.popleft()
            popped += 1
            cost += held.cost
            rows += held.rows or 1  # work_rows
            if current(held):
                out.append(held)
        if popped:
            self.buffered_bytes -= cost
            self.buffered_rows -= rows
            self._room.set()
        self.report()
        if popped:
            self.update_fetch_pause()
        return out

    def purge(self, tps: set[TopicPartition]) -> None:
        """Drop buffered and retry-waiting records of ``tps`` (never yielded again)."""
        kept = deque(h for h in self.buffer if h.tp not in tps)
        self.buffered_bytes = sum(h.cost for h in kept)
        self.buffered_rows = sum(map(work_rows, kept))
        self.buffer = kept
        self._room.set()
        self.retries = [r for r in self.retries if r[2].tp not in tps]
        heapq.heapify(self.retries)
        self.retry_bytes = sum(r[2].cost for r in self.retries)
        self.report()
        self.update_fetch_pause()

    def _budget_changed(self) -> None:
        self._room.set()
        self.update_fetch_pause()

    def report(self) -> None:
        if self.budget is not None:
            self.budget.set_ahead(self.buffered_bytes + self.retry_bytes)

    def budget_room(self) -> int:
        """Room for read-ahead in the shared budget: what is left of it, and no more than
        ``READ_AHEAD_SHARE`` of it in all (the pipeline keeps the rest)."""
        budget = self.budget
        assert budget is not None
        share = budget.limit * READ_AHEAD_SHARE - self.bytes
        return min(budget.room, int(share))

    def poll_records(self) -> int:
        """At most ``max_poll_records``, and no more than the room left (in the budget and
        under ``max_buffered_bytes``) holds at the mean cost of the records seen so far, nor
        than the rows left under the rows bound hold at the mean rows per record (one record
        before any was seen)."""
        limit = min(
            self._config.max_poll_records,
            max(1, self._config.max_buffered_records - len(self.buffer)),
        )
        if self.max_rows is not None:
            if not self.records_seen:
                return 1
            rows_left = max(1, self.max_rows - self.buffered_rows)
            limit = min(limit, math.ceil(rows_left / max(1.0, self.rows_per_record)))
        if not self.records_seen:
            return min(limit, 64) if self.budget is not None else limit
        room = self._config.max_buffered_bytes - self.buffered_bytes
        if self.budget is not None:
            room = min(room, self.budget_room())
        mean = max(1, self.cost_seen // self.records_seen)
        return max(1, min(limit, room // mean))

    def update_fetch_pause(self) -> None:
        """Pause fetching while paused by the pipeline or while the buffer has stayed full for
        ``stall_s``; resume once neither holds and the buffer has drained to half."""
        cfg = self._config
        budget = self.budget
        if self.stalled and not self.full():
            self.stalled = False
        if self.paused:
            want = True
        elif self.fetch_paused:
            want = not (
                len(self.buffer) <= cfg.max_buffered_records // 2
                and self.buffered_bytes <= cfg.max_buffered_bytes // 2
                and (budget is None or self.budget_room() > budget.limit * READ_AHEAD_SHARE / 2)
                and (self.max_rows is None or self.buffered_rows <= self.max_rows // 2)
            )
        else:
            want = self.stalled
        if want == self.fetch_paused:
            return
        self.fetch_paused = want
        consumer = self._started_consumer()
        if consumer is None:
            return
        if want:
            consumer.pause(*consumer.assignment())
        else:
            consumer.resume(*consumer.paused())


__all__ = ["STALL_S", "ReadAhead"]
