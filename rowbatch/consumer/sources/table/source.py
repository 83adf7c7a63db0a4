"""``TableSource``: a stored table as a :class:`~rowbatch.consumer.sources.base.Source`, so the
engine (intake, batcher, inference, sink, poison rules) runs over it unchanged.

Each chunk is a delivery whose payload is what a producer would publish for those rows. The
source keeps its progress per row (``KeepsRowProgress``): after each sink write (or commit) the
engine tells it which rows were made durable, of chunks whole or not, and their ranges are
recorded in the shard's progress before any ack, so a restart redoes only rows not yet written
(a part of a chunk keeps the chunk's keys: ``Delivery.row_offset``). Rows that fail on their own
(the model's per-row rejections, the sink's refused rows) are dead-lettered as rows
(``DeadLettersRows``): written to the dead-letter file with their reason and recorded in the
progress before the engine acks the chunk, whose other rows are written once. A dead letter of a
whole chunk of several rows (a failure the engine cannot pin to rows) cuts it in halves, which go
round again without the rows already written (the engine deletes none of them), until each bad
row stands alone and is written to the dead-letter file (a reason that holds for every row, a
missing column or a column of the wrong type, is not bisected). A nack puts the chunk back. The
deliveries end once every row of the shard is settled, so the engine drains and the run ends by
itself.

Reading (files, decoding, encoding) runs in a worker thread, a few chunks ahead of the engine
(``read_ahead_chunks``, and within a quarter of the byte budget); a read that fails on the
filesystem (an object store down) is retried with backoff, from where it stopped."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from rowbatch.consumer.sources.base import (
    READ_AHEAD_SHARE,
    VECTOR_MAX,
    DeadLetterFailed,
    DeliveryIterator,
    SharedBudget,
    SourceConfigError,
    VectorIterator,
    WorkBound,
    WrittenRows,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.table.checkpoint import Checkpoint, RunIdentity, RunMismatch, Settled
from rowbatch.consumer.sources.table.dead_letters import (
    lettered_rows,
    records,
    unreadable_record,
    write_dead_letters,
)
from rowbatch.consumer.sources.table.encode import Encoded, encode_piece
from rowbatch.consumer.sources.table.layout import shared_plan
from rowbatch.consumer.sources.table.plan import (
    TableInputError,
    Unit,
    describe_units,
    open_filesystem,
    plan_table,
)
from rowbatch.consumer.sources.table.reader import Piece, UnitReader
from rowbatch.consumer.sources.table.settings import TableSettings
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.tables.schema import parse_schema
from rowbatch.timing import Backoff
from rowbatch.wire.chunks.encode import EncodedChunk
from rowbatch.wire.chunks.row_parts import parent_of
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_CHUNK_ID, H_ROW_COUNT

log = logging.getLogger(__name__)

WHOLE_CHUNK_CODES: Final = frozenset(
    {"missing_column", "column_type_mismatch", "schema_mismatch", "too_many_attempts"}
)
"""Dead-letter codes that hold for every row of a chunk alike: not bisected."""
READ_RETRY: Final = Backoff(1.0, 60.0, jitter=0.0)
"""The waits after a read (or a state write) failing on the filesystem: 1 s at first, doubling
up to 60 s."""
CONTENT_ATTEMPTS: Final = 3
"""Reads of one place in a file that may fail while the store still finds the file before
the rest of the unit is taken as unreadable (pyarrow reports a corrupt Parquet page as an
OSError, like a store that is down: a store that answers tells them apart)."""

Probe = Callable[[Delivery], DeadLetterReason | None]
"""Start-up check of the first chunk against the binding: the reason it would be
dead-lettered, or None."""


@dataclass(frozen=True)
class Unreadable:
    """The rest of a unit, from ``first_row``, that failed to read for a reason other than
    the filesystem (the file is corrupt, truncated, or not in its format)."""

    unit: Unit
    first_row: int
    error: TableInputError

    @property
    def rows(self) -> int | None:
        """How many rows are lost (known for Parquet; None for a text file)."""
        if self.unit.rows is None:
            return None
        return self.unit.first_row + self.unit.rows - self.first_row

    def describe(self) -> str:
        last = "" if self.rows is None else f"-{self.first_row + self.rows - 1}"
        return (
            f"{self.unit.file.relative} rows {self.first_row}{last or ' to its end'}: {self.error}"
        )


class _UnitFailed(Exception):
    def __init__(self, unreadable: Unreadable) -> None:
        super().__init__(unreadable.describe())
        self.unreadable = unreadable


@dataclass
class TableCounts:
    """Rows of this shard so far."""

    planned: int | None = None
    """Rows in the shard (known for Parquet)."""
    skipped: int = 0
    """Settled by an earlier run of the same shard, not read again."""
    read: int = 0
    """Handed to the engine in this run."""
    written: int = 0
    dead_lettered: int = 0
    chunks: int = 0
    """Chunks written in this run."""
    unreadable: list[str] = field(default_factory=list)
    """The parts of the input that could not be read (a corrupt or truncated file), each
    named with where and why: their rows are in no chunk and in the dead-letter file as one
    record per part; a rerun reads them again."""
    bytes: int = 0
    """Their payload bytes (the rows as the engine read them)."""
    first_write_at: float | None = None
    """When the first write of this run was acked (monotonic)."""
    first_write_rows: int = 0
    last_write_at: float | None = None
    first_write_cpu: float = 0.0
    """The process's CPU time (``time.process_time``) then, and at the last write."""
    last_write_cpu: float = 0.0

    @property
    def settled(self) -> int:
        return self.written + self.dead_lettered


class _TableMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.rows = Counter(
            "rowbatch_table_rows",
            "Rows of the table run settled by this process, by outcome (written, dead_lettered)",
            ["outcome"],
            registry=registry,
        )
        self.planned = Gauge(
            "rowbatch_table_rows_planned",
            "Rows in this shard of the table run (0 until known: text formats)",
            registry=registry,
        )
        self.skipped = Gauge(
            "rowbatch_table_rows_skipped",
            "Rows of this shard settled by an earlier run (not read again)",
            registry=registry,
        )


@dataclass
class _Held:
    piece: Piece
    attempt: int
    dead: set[int] = field(default_factory=set)
    """Its rows (indexes in the piece) dead-lettered on their own (``dead_letter_rows``)."""


def _runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """``rows`` (ascending, distinct) as runs ``(first, count)`` of consecutive rows."""
    out: list[tuple[int, int]] = []
    for row in rows:
        if out and out[-1][0] + out[-1][1] == row:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((row, 1))
    return out


def _part_rows(delivery: Delivery, attributes: Mapping[str, str], rows: int) -> list[int]:
    """The indexes, in ``delivery``'s chunk of ``rows`` rows, of the rows its row part
    (``attributes``: ``rowbatch.wire.chunks.row_parts``) holds; ValueError when the part is
    not one of this chunk's."""
    if H_PARENT_CHUNK_ID in delivery.attributes:  # a table chunk is never a part itself
        raise ValueError(f"{delivery.message_id} is a row part itself")
    found = parent_of(attributes, int(attributes.get(H_ROW_COUNT, "")))
    if found is None or found[0] != delivery.attributes.get(H_CHUNK_ID):
        raise ValueError(f"the dead letter is not a row part of {delivery.message_id}")
    index = [int(i) for i in found[1]]
    if not index or index[-1] >= rows:
        raise ValueError(f"row part of {delivery.message_id}: rows {index} of {rows}")
    return index


@dataclass(frozen=True)
class TableModel:
    """The model a table run answers with, as its run identity records it: a rerun with another
    model, version or binding is a new run."""

    name: str
    version: str
    binding: Mapping[str, Any]


class TableSource:
    """A shard of a stored table, read once (see the module's docstring)."""

    def __init__(
        self,
        settings: TableSettings,
        *,
        model: TableModel,
        columns: Sequence[str] | None = None,
        probe: Probe | None = None,
        registry: CollectorRegistry | None = None,
        sleep: Callable[[float], None] = time.sleep,
        async_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._s = settings
        self._model = model
        self._columns = columns
        self._probe = probe
        self._sleep = sleep
        self._async_sleep = async_sleep
        self._schema = parse_schema(settings.schema_text) if settings.schema_text else {}
        self._metrics = _TableMetrics(registry)
        self.counts = TableCounts()
        self.complete = False
        """Every row of the shard is settled (set when the deliveries end): not when a part
        of the input could not be read (``counts.unreadable``)."""
        self._units: tuple[Unit, ...] = ()
        self._folder: StateFolder | None = None
        self._checkpoint: Checkpoint | None = None
        self._ready: collections.deque[Delivery] = collections.deque()
        self._ready_bytes = 0
        self._ready_rows = 0
        self._retry: collections.deque[Delivery] = collections.deque()
        self._held: dict[str, _Held] = {}
        self._changed = asyncio.Event()
        self._feed: asyncio.Task[None] | None = None
        self._fed_all = False
        self._failure: BaseException | None = None
        self._paused = False
        self._closed = False
        self._budget: SharedBudget | None = None
        self._max_ahead_rows: int | None = None
        self._lettered: set[tuple[str, int]] = set()
        """``(file key, file row)`` of rows whose dead-letter records this process wrote and
        whose progress record has not been written yet (a try again of that write, after the
        progress write failed, does not write the records twice)."""
        self._lettering = threading.Lock()

    # --- start-up ------------------------------------------------------------------------------

    @property
    def state_location(self) -> str:
        assert self._folder is not None
        return self._folder.location

    def identity(self, shard: int) -> RunIdentity:
        model, version, binding = self._model.name, self._model.version, dict(self._model.binding)
        return RunIdentity(
            input=self._s.input,
            format=self._s.format,
            schema=self._s.schema_text,
            chunk_rows=self._s.chunk_rows,
            shards=self._s.shards,
            shard=shard,
            model=model,
            model_version=version,
            binding=binding,
        )

    async def check(self) -> None:
        """Lists the input and reads its Parquet footers, opens (or resumes) the shard's
        progress, and checks the first chunk against the binding."""
        try:
            shard = self._s.shard_index()
            plan = await asyncio.to_thread(plan_table, self._s.input, self._s.format)
            plan = await asyncio.to_thread(
                shared_plan, self._s.state, plan, self._s.shards, new_run=self._s.new_run
            )
            self._units = plan.shard(shard, self._s.shards)
            name = f"shard-{shard}-of-{self._s.shards}"
            self._folder = await asyncio.to_thread(StateFolder, self._s.state, name)
            self._checkpoint = await asyncio.to_thread(
                Checkpoint.open, self._folder, self.identity(shard), new_run=self._s.new_run
            )
        except (TableInputError, RunMismatch, ValueError) as exc:
            raise SourceConfigError(f"[source] table: {exc}") from exc
        known = [u.rows for u in self._units]
        self.counts.planned = None if None in known else sum(r or 0 for r in known)
        await asyncio.to_thread(self._settle_lettered)
        self.counts.skipped = self._checkpoint.settled_rows()
        self._metrics.planned.set(self.counts.planned or 0)
        self._metrics.skipped.set(self.counts.skipped)
        log.info(
            "table %s, shard %d of %d: %s, %s rows; %d already settled (progress in %s)",
            self._s.input,
            shard,
            self._s.shards,
            describe_units(self._units) if self._units else "no units",
            "?" if self.counts.planned is None else f"{self.counts.planned:,}",
            self.counts.skipped,
            self._folder.location,
        )
        if self._probe is not None:
            await self._check_first_chunk(self._probe)

    async def _check_first_chunk(self, probe: Probe) -> None:
        """A reason that holds for every row (a column missing, or of a type the wire or the
        binding cannot take) shows in the shard's first chunk: refused here rather than
        every row dead-lettered one by one."""
        first = await asyncio.to_thread(self._first_encoded)
        if first is None:
            return
        piece, encoded = first
        where = f"[source] table: {piece.unit.file.relative}"
        if not encoded.chunks:
            why = encoded.bad[0][1]
            raise SourceConfigError(
                f"{where}: no row of its first {piece.rows} converts to the wire's column "
                f"types ({why.message}); declare the types with [source] schema or leave "
                "such columns out of the binding"
            )
        part, chunk = encoded.chunks[0]
        reason = probe(self._delivery(part, chunk, 1, hold=False))
        if reason is not None and reason.code in WHOLE_CHUNK_CODES:
            raise SourceConfigError(f"{where} does not fit the binding: {reason.message}")

    def _settle_lettered(self) -> None:
        """Blocking: rows with a dead-letter record that the progress does not hold (a kill
        between the record and the progress write) are recorded as dead-lettered, so this run
        neither dead-letters them again nor sends them to the model. Only read when some rows
        of the shard are not settled yet."""
        assert self._folder is not None and self._checkpoint is not None
        checkpoint = self._checkpoint
        if not any(
            u.rows is None or checkpoint.missing(u.file.key, u.first_row, u.rows)
            for u in self._units
        ):
            return
        keys = {u.file.relative: u.file.key for u in self._units}
        late = sorted(
            (keys[file], row)
            for file, row in lettered_rows(self._folder)
            if file in keys and checkpoint.missing(keys[file], row, 1)
        )
        settled: list[Settled] = []
        for key, row in late:
            last = settled[-1] if settled else None
            if last is not None and last.file == key and last.first_row + last.rows == row:
                settled[-1] = Settled(key, last.first_row, last.rows + 1, "d")
            else:
                settled.append(Settled(key, row, 1, "d"))
        if settled:
            checkpoint.record(settled)
            log.warning(
                "%d dead-lettered row(s) had a dead-letter record but no progress record (a "
                "kill between the two): recorded as dead-lettered now",
                len(late),
            )

    def _first_encoded(self) -> tuple[Piece, Encoded] | None:
        """The first piece of the first unit that reads (one that cannot is the run's to
        retry or report at its turn), encoded."""
        reader = self._reader()
        try:
            for unit in self._units:
                try:
                    for piece in reader.pieces(unit):
                        if piece.bad_line is None:  # a bad line says nothing of the rest
                            return piece, encode_piece(piece, self._s.table, self._schema)
                except TableInputError as exc:
                    log.warning("start-up check: %s; checking the next unit", exc)
                    reader.close()
            return None
        finally:
            reader.close()

    def _reader(self) -> UnitReader:
        fs, _ = open_filesystem(self._s.input)
        return UnitReader(fs, self._s.chunk_rows, self._columns, self._schema)

    # --- the engine's side ---------------------------------------------------------------------

    def share_budget(self, budget: SharedBudget) -> None:
        self._budget = budget

    def bound_read_ahead(self, bound: WorkBound) -> None:
        self._max_ahead_rows = bound.rows

    def deliveries(self) -> AsyncIterator[Delivery]:
        vector: collections.deque[Delivery] = collections.deque()

        async def next_delivery() -> Delivery:
            if not vector:
                vector.extend(await self._next_vector())
            return vector.popleft()

        return DeliveryIterator(next_delivery)

    def vectors(self) -> AsyncIterator[Sequence[Delivery]]:
        return VectorIterator(self._next_vector)

    async def _next_vector(self) -> Sequence[Delivery]:
        if self._feed is None and not self._closed:
            self._feed = asyncio.create_task(self._run_feed(), name="rowbatch-table-read")
        while True:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise StopAsyncIteration
            if not self._paused and (self._retry or self._ready):
                return self._take()
            if self._all_settled():
                self.complete = not self.counts.unreadable
                raise StopAsyncIteration
            self._changed.clear()
            await self._changed.wait()

    def _all_settled(self) -> bool:
        """Every row was read, handed out and settled."""
        return self._fed_all and not self._held and not self._retry and not self._ready

    def _take(self) -> list[Delivery]:
        out: list[Delivery] = []
        while self._retry and len(out) < VECTOR_MAX:
            out.append(self._retry.popleft())
        while self._ready and len(out) < VECTOR_MAX:
            delivery = self._ready.popleft()
            self._ready_bytes -= delivery.size
            self._ready_rows -= self._held[delivery.message_id].piece.rows
            out.append(delivery)
        self._ahead_changed()
        return out

    def _ahead_changed(self) -> None:
        if self._budget is not None:
            self._budget.set_ahead(self._ready_bytes)
        self._changed.set()

    def _ahead_full(self) -> bool:
        if not self._ready:
            return False
        if len(self._ready) >= self._s.read_ahead_chunks:
            return True
        if self._max_ahead_rows is not None and self._ready_rows >= self._max_ahead_rows:
            return True
        return (
            self._budget is not None and self._ready_bytes >= self._budget.limit * READ_AHEAD_SHARE
        )

    async def ack(self, delivery: Delivery) -> None:
        await self.ack_many([delivery])

    async def rows_written(self, written: Sequence[WrittenRows]) -> None:
        """Records the rows (of messages whole or not) a sink write made durable, so a
        restart redoes none of them (``KeepsRowProgress``): one record per write."""
        assert self._checkpoint is not None
        settled = []
        for delivery, start, stop in written:
            if stop > start:  # the id is <file key>@<first row>: settled or not, it says where
                key, first_row = delivery.message_id.rsplit("@", 1)
                settled.append(Settled(key, int(first_row) + start, stop - start, "w"))
        await self._durably("recording progress", self._checkpoint.record, settled)

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        """Records the deliveries' rows not recorded already (by ``rows_written``) as written,
        then forgets them. Not those of a chunk with rows dead-lettered on their own: the
        engine may ack such a chunk as soon as its last rows failed, before the commit of a
        sink that stages its writes holds its other rows (``Settler.fail_rows``), so they are
        recorded only as ``rows_written`` tells them (after that commit); rows it never tells
        are read again by a rerun, and written again under the same keys."""
        held = [self._held[d.message_id] for d in deliveries]
        assert self._checkpoint is not None
        checkpoint = self._checkpoint
        settled = [
            Settled(h.piece.unit.file.key, first, rows, "w")
            for h in held
            if not h.dead
            for first, rows in checkpoint.missing(
                h.piece.unit.file.key, h.piece.first_row, h.piece.rows
            )
        ]
        await self._durably("recording progress", self._checkpoint.record, settled)
        rows = 0
        for d, h in zip(deliveries, held, strict=True):
            del self._held[d.message_id]
            rows += h.piece.rows - len(h.dead)
            self.counts.bytes += d.size
        self.counts.chunks += len(deliveries)
        self._count_written(rows)

    def _count_written(self, rows: int) -> None:
        self.counts.written += rows
        now, cpu = time.monotonic(), time.process_time()
        if self.counts.first_write_at is None:
            self.counts.first_write_at, self.counts.first_write_rows = now, rows
            self.counts.first_write_cpu = cpu
        self.counts.last_write_at, self.counts.last_write_cpu = now, cpu
        self._metrics.rows.labels("written").inc(rows)
        self._changed.set()

    async def nack(self, delivery: Delivery) -> None:
        held = self._held.get(delivery.message_id)
        if held is None:  # settled already (a dead letter that raised after settling it)
            return
        held.attempt += 1
        self._retry.append(self._delivery_again(delivery, held.attempt))
        self._changed.set()

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        held = self._held[delivery.message_id]
        piece = held.piece
        if piece.rows > 1 and reason.code not in WHOLE_CHUNK_CODES:
            # Its rows written already stay (the engine deletes none: KeepsRowProgress);
            # the halves take the rest, with the same keys.
            parts: list[tuple[Piece, EncodedChunk]] = []
            left = self._halves_left(piece)
            for half in left:
                encoded = await asyncio.to_thread(encode_piece, half, self._s.table, self._schema)
                await self._settle_bad(encoded, held.attempt)
                parts += encoded.chunks
            del self._held[delivery.message_id]  # a part may take its id over
            kept = piece.rows - sum(half.rows for half in left) - len(held.dead)
            if kept:  # its rows recorded as written stay written
                self._count_written(kept)
            for sub, chunk in parts:
                self._retry.append(self._delivery(sub, chunk, held.attempt))
            log.info(
                "%s (%d rows) dead-lettered (%s): cut in halves to find its bad rows",
                piece.message_id,
                piece.rows,
                reason.code,
            )
        else:  # but its rows dead-lettered on their own already (before a nack)
            alive = [i for i in range(piece.rows) if i not in held.dead]
            bad = [(piece.part(first, n), reason) for first, n in _runs(alive)]
            await self._durably("writing dead letters", self._write_dead_letters, bad, held.attempt)
            del self._held[delivery.message_id]
        self._changed.set()

    @property
    def dead_letters_rows(self) -> bool:
        """Rows failing on their own go to the dead-letter file as rows (``DeadLettersRows``),
        the rest of their chunk written once."""
        return True

    async def dead_letter_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None:
        """Writes the rows of ``delivery`` that its row part (``attributes``; ``payload`` is
        not needed: the rows are read from the held piece) names to the dead-letter file, one
        record each as a chunk cut down to them would have (``_write_dead_letters``), and
        records them in the progress as dead-lettered, both durably, before returning; the
        delivery stays held (the engine acks it once its other rows are written). Rows the
        progress holds already (a delivery dead-lettered again after a nack) get no second
        record. A state store that fails is tried again with backoff; any other failure
        raises :class:`DeadLetterFailed` (the engine then nacks the delivery)."""
        held = self._held.get(delivery.message_id)
        if held is None:
            raise DeadLetterFailed(f"{delivery.message_id} is not held: settled already")
        try:
            rows = _part_rows(delivery, attributes, held.piece.rows)
            await self._durably(
                "writing dead letters", self._write_row_part, held.piece, rows, reason, held.attempt
            )
        except Exception as exc:
            raise DeadLetterFailed(
                f"dead letters of rows of {delivery.message_id} not written: {exc}"
            ) from exc
        held.dead.update(rows)
        self._changed.set()

    def _write_row_part(
        self, piece: Piece, rows: Sequence[int], reason: DeadLetterReason, attempt: int
    ) -> None:
        """Blocking: ``rows`` of ``piece`` (indexes in it) not yet settled, dead-lettered."""
        assert self._checkpoint is not None
        key = piece.unit.file.key
        bad: list[tuple[Piece, DeadLetterReason]] = []
        for start, count in _runs(rows):
            run = piece.part(start, count)
            for first, n in self._checkpoint.missing(key, run.first_row, run.rows):
                bad.append((run.part(first - run.first_row, n), reason))
        self._write_dead_letters(bad, attempt)

    def _halves_left(self, piece: Piece) -> list[Piece]:
        """The rows of ``piece``'s halves not yet recorded as written."""
        assert self._checkpoint is not None
        half = piece.rows // 2
        out = []
        for part in (piece.part(0, half), piece.part(half, piece.rows - half)):
            key = part.unit.file.key
            for first, rows in self._checkpoint.missing(key, part.first_row, part.rows):
                out.append(part.part(first - part.first_row, rows))
        return out

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._changed.set()

    async def close(self) -> None:
        # A run stopped (SIGTERM) after its last row was settled but before the engine asked
        # for more is as complete as one that saw the end of its deliveries.
        if self._failure is None and self._all_settled():
            self.complete = not self.counts.unreadable
        self._closed = True
        self._changed.set()
        if self._feed is not None:
            self._feed.cancel()
            await asyncio.gather(self._feed, return_exceptions=True)

    # --- reading -------------------------------------------------------------------------------

    def _delivery(
        self, piece: Piece, chunk: EncodedChunk, attempt: int, *, hold: bool = True
    ) -> Delivery:
        """The delivery of ``chunk``; ``hold``: it goes to the engine (kept until settled)."""
        delivery = Delivery.of_rows(
            message_id=piece.message_id,
            payload=chunk.payload,
            attributes=chunk.attributes,
            publish_time=time.time(),
            delivery_attempt=attempt,
            source=piece.unit.file.relative,
            size=chunk.size,
            row_offset=piece.row_offset,
        )
        if hold:
            self._held[delivery.message_id] = _Held(piece, attempt)
        return delivery

    def _delivery_again(self, delivery: Delivery, attempt: int) -> Delivery:
        return Delivery.of_rows(
            message_id=delivery.message_id,
            payload=delivery.payload,
            attributes=delivery.attributes,
            publish_time=delivery.publish_time,
            delivery_attempt=attempt,
            source=delivery.source,
            size=delivery.size,
            row_offset=delivery.row_offset,
        )

    def _write_dead_letters(self, bad: list[tuple[Piece, DeadLetterReason]], attempt: int) -> None:
        """Blocking: the rows' records (but those this process wrote already, in a try of the
        same write whose progress record failed), then their ranges in the progress."""
        assert self._folder is not None and self._checkpoint is not None
        if not bad:
            return
        keys = {(p.unit.file.key, p.first_row + i) for p, _ in bad for i in range(p.rows)}
        with self._lettering:
            done = set(self._lettered)
        lines = [
            line
            for piece, reason in bad
            for part in self._unlettered(piece, done)
            for line in records(part, reason, attempt=attempt)
        ]
        write_dead_letters(self._folder, lines)
        with self._lettering:
            self._lettered |= keys
        self._checkpoint.record(Settled(p.unit.file.key, p.first_row, p.rows, "d") for p, _ in bad)
        with self._lettering:
            self._lettered -= keys
        rows = sum(p.rows for p, _ in bad)
        self.counts.dead_lettered += rows
        self._metrics.rows.labels("dead_lettered").inc(rows)
        for piece, reason in bad:
            log.warning(
                "dead letter: %s rows %d-%d (%s): %s",
                piece.unit.file.relative,
                piece.first_row,
                piece.first_row + piece.rows - 1,
                reason.code,
                reason.message,
            )

    @staticmethod
    def _unlettered(piece: Piece, done: set[tuple[str, int]]) -> list[Piece]:
        """The parts of ``piece`` whose rows are not in ``done`` (``(file key, file row)``)."""
        key = piece.unit.file.key
        if not done or not any((key, piece.first_row + i) in done for i in range(piece.rows)):
            return [piece]
        left = [i for i in range(piece.rows) if (key, piece.first_row + i) not in done]
        return [piece.part(first, n) for first, n in _runs(left)]

    def _write_unreadable(self, unreadable: Unreadable) -> None:
        """Blocking: one dead-letter record for the part that cannot be read. Its rows are
        not recorded as settled, so a rerun (after the file is mended) reads them again."""
        assert self._folder is not None
        record = unreadable_record(
            unreadable.unit.file.relative,
            unreadable.first_row,
            unreadable.rows,
            str(unreadable.error),
        )
        write_dead_letters(self._folder, [record])
        self.counts.unreadable.append(unreadable.describe())
        if unreadable.rows is not None:
            self._metrics.rows.labels("unreadable").inc(unreadable.rows)
        log.error(
            "cannot read %s; its rows are skipped in this run (a dead-letter record says so, "
            "a rerun reads them again)",
            unreadable.describe(),
        )

    async def _settle_bad(self, encoded: Encoded, attempt: int) -> None:
        if encoded.bad:
            await self._durably(
                "writing dead letters", self._write_dead_letters, encoded.bad, attempt
            )

    async def _durably(self, what: str, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` in a thread, again with backoff while the state's filesystem
        fails (an object store down is a pause, not the end of the run)."""
        failures = 0
        while True:
            try:
                await asyncio.to_thread(write, *args)
            except OSError as exc:
                failures += 1
                wait = READ_RETRY.wait(failures)
                log.warning(
                    "%s in %s failed (%s); trying again in %.0f s", what, self._s.state, exc, wait
                )
                await self._async_sleep(wait)
            else:
                return

    async def _run_feed(self) -> None:
        pieces = self._pieces()
        try:
            while not self._closed:
                while self._ahead_full() and not self._closed:
                    self._changed.clear()
                    await self._changed.wait()
                encoded = await asyncio.to_thread(next, pieces, None)
                if encoded is None:
                    break
                if isinstance(encoded, Unreadable):
                    await self._durably("writing dead letters", self._write_unreadable, encoded)
                    continue
                await self._settle_bad(encoded, 1)
                for piece, chunk in encoded.chunks:
                    delivery = self._delivery(piece, chunk, 1)
                    self._ready.append(delivery)
                    self._ready_bytes += delivery.size
                    self._ready_rows += piece.rows
                    self.counts.read += piece.rows
                self.counts.read += sum(p.rows for p, _ in encoded.bad)
                self._ahead_changed()
            self._fed_all = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("reading the table failed")
            self._failure = exc
        finally:
            self._changed.set()

    def _pieces(self) -> Iterator[Encoded | Unreadable]:
        """Blocking: the shard's rows not yet settled, encoded, in order; the rest of a unit
        that cannot be read, once."""
        assert self._checkpoint is not None
        checkpoint = self._checkpoint
        reader = self._reader()
        try:
            for unit in self._units:
                key = unit.file.key
                if unit.rows is not None and not checkpoint.missing(key, unit.first_row, unit.rows):
                    continue
                try:
                    for piece in self._unit_pieces(reader, unit):
                        for first, rows in checkpoint.missing(key, piece.first_row, piece.rows):
                            part = piece.part(first - piece.first_row, rows)
                            yield encode_piece(part, self._s.table, self._schema)
                except _UnitFailed as failed:
                    reader.close()
                    yield failed.unreadable
        finally:
            reader.close()

    def _unit_pieces(self, reader: UnitReader, unit: Unit) -> Iterator[Piece]:
        """The unit's pieces. A read failing on the filesystem is retried with backoff (the
        pieces already yielded are not yielded again) while the store does not answer, or up
        to ``CONTENT_ATTEMPTS`` times while it does; a read failing otherwise (the file's
        content: not in its format, corrupt) raises ``_UnitFailed`` for the rest."""
        next_row = unit.first_row
        failures = 0
        content_failures = 0
        while True:
            try:
                for piece in reader.pieces(unit):
                    if piece.first_row < next_row:
                        continue
                    yield piece
                    next_row = piece.first_row + piece.rows
                    failures = 0
                    content_failures = 0
            except TableInputError as exc:
                cause = exc.__cause__
                if isinstance(cause, FileNotFoundError):
                    raise  # the input changed under the run: its plan no longer holds
                if not isinstance(cause, OSError):
                    raise _UnitFailed(Unreadable(unit, next_row, exc)) from exc
                reader.close()
                if reader.store_answers(unit):
                    content_failures += 1
                    if content_failures >= CONTENT_ATTEMPTS:
                        raise _UnitFailed(Unreadable(unit, next_row, exc)) from exc
                failures += 1
                wait = READ_RETRY.wait(failures)
                log.warning("%s; reading it again in %.0f s", exc, wait)
                self._sleep(wait)
            else:
                return


__all__ = ["WHOLE_CHUNK_CODES", "TableCounts", "TableSource", "Unreadable"]
