"""The ``Sink`` seam: result tables with idempotent writes keyed on ``(chunk_id, row_index)``.

The result row (one per input row) is:

============================  =================================================================
column                        meaning
============================  =================================================================
``chunk_id`` (text)           the wire contract's idempotency key; with ``row_index`` the
                              primary key, so a redelivered or re-sent chunk never duplicates
``row_index`` (int)           the row's position inside its chunk
``source_message_id`` (text)  the broker's message id (Pub/Sub id or topic/partition/offset)
passthrough key columns       copied from the input row, as configured
output columns                one per model output, as configured (vectors as arrays)
``model_name`` (text)
``model_version`` (text)
``processed_at`` (timestamp)  UTC, when the batch's inference answered
============================  =================================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class ColumnSpec:
    """A result column's type, from the model config (outputs) or the wire schema (passthrough).

    ``dtype`` is a numpy dtype name (``float32``, ``int64``, ``bool``, ``object`` for text);
    ``dim`` is 0 for scalars and the vector length for fixed-size vectors."""

    name: str
    dtype: str
    dim: int = 0


@dataclass(frozen=True)
class TableSpec:
    """The result table's name and its non-key columns (passthrough first, then outputs)."""

    name: str
    passthrough: tuple[ColumnSpec, ...]
    outputs: tuple[ColumnSpec, ...]


@dataclass(frozen=True, eq=False)
class ResultRows:
    """Result rows for one written batch; every array has ``len(chunk_id)`` rows (vectors are
    2-D: rows x dim). ``nulls`` maps a passthrough column to its null mask when it has nulls."""

    chunk_id: NDArray[np.object_]
    row_index: NDArray[np.int64]
    source_message_id: NDArray[np.object_]
    passthrough: Mapping[str, NDArray[Any]]
    outputs: Mapping[str, NDArray[Any]]
    nulls: Mapping[str, NDArray[np.bool_]]
    model_name: str
    model_version: str
    processed_at: datetime

    def __len__(self) -> int:
        return int(self.chunk_id.shape[0])


class Sink(Protocol):
    """A result table. ``write`` is idempotent on ``(chunk_id, row_index)``: rows already there
    are left as they are, so a redelivered message never duplicates a row."""

    async def open(self, table: TableSpec) -> None:
        """Connect and create the table if it is absent (check it fits if present)."""

    async def write(self, rows: ResultRows) -> int:
        """Durably write the rows (committed when this returns). Returns how many were stored:
        rows whose key was there already are skipped (a redelivery), not counted."""

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        """Remove every row of these chunks: used when a message that was partly written is
        dead-lettered, so its rows end up in exactly one place."""

    async def close(self) -> None: ...


@runtime_checkable
class CommitsWrites(Protocol):
    """A sink whose ``write`` stages rows (in large files) that become part of the table only at
    ``commit``: the pipeline acks a message after the commit that holds its last row
    (:mod:`rowbatch.consumer.engine.commit_stage` decides when to commit)."""

    target_file_bytes: int
    """Commit once this many bytes are staged (a full data file)."""

    async def commit(self) -> None:
        """Every row written so far is in the table when this returns (``SinkUnavailable``:
        the store cannot commit now; the rows stay staged and the call is retried)."""

    def uncommitted_bytes(self) -> int:
        """Bytes staged since the last commit."""


@runtime_checkable
class BuffersFiles(Protocol):
    """A sink that gathers rows into the row groups of open data files (Parquet, Iceberg):
    between writes it holds a row group being gathered and, while that is encoded, the
    writer's pages, outside any one write. The pipeline asks it, before the first write, to
    size its row groups to the memory budget and sets what it returns aside in the budget."""

    def fit_buffers(self, budget_bytes: int) -> int:
        """Size the row groups for ``budget_bytes``; the most bytes the open files hold
        between writes."""


# --- helpers shared by the sink adapters ------------------------------------------------------

#: A sink encodes a write in slices of about this many bytes of row values (PostgreSQL's COPY
#: data, Parquet's data pages), so what it holds to encode a write does not grow with it.
ENCODE_SLICE_BYTES: int = 1024 * 1024

#: The columns every result table has besides the passthrough and output columns.
KEY_COLUMNS: tuple[str, str] = ("chunk_id", "row_index")
RESERVED_COLUMNS: frozenset[str] = frozenset(
    {*KEY_COLUMNS, "source_message_id", "model_name", "model_version", "processed_at"}
)

#: ``ColumnSpec.dtype`` values every sink stores. Text is ``object`` (or ``str``); raw bytes
#: (the wire's ``bytes`` kind) are ``bytes``. Vectors (``dim > 0``) take the numeric and bool ones.
SCALAR_DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        *(f"int{b}" for b in (8, 16, 32, 64)),
        *(f"uint{b}" for b in (8, 16, 32)),
        *(f"float{b}" for b in (16, 32, 64)),
        "object",
        "str",
        "bytes",
    }
)
TEXT_DTYPES: frozenset[str] = frozenset({"object", "str"})
VECTOR_DTYPES: frozenset[str] = SCALAR_DTYPES - TEXT_DTYPES - {"bytes"}


class SinkError(Exception):
    """A sink cannot do what was asked; the message says what and why."""


class SinkUnavailable(SinkError):
    """Transient: the sink cannot take writes *now* (connection lost, database restarting or
    failing over, serialization failure or deadlock, object-store 5xx or throttling). The
    pipeline retries the same write with backoff, pausing consumption, for as long as it takes;
    nothing is dead-lettered or nacked for it."""


class RowsRejected(SinkError):
    """Permanent, about the data: the sink can never store (some of) these rows (a value the
    database refuses). Retrying the same rows cannot help; the pipeline bisects the write by
    message and dead-letters the messages that fail alone as ``rejected-by-sink``.

    ``code`` is the fine reason code written to the dead letter (``sink_rejected_value`` unless
    a sink knows better); the message carries the database's own words."""

    def __init__(self, message: str, *, code: str = "sink_rejected_value") -> None:
        super().__init__(message)
        self.code = code


class TableMismatch(SinkError):
    """The table exists but does not fit the ``TableSpec``; ``column`` names the culprit."""

    def __init__(self, message: str, *, column: str) -> None:
        super().__init__(message)
        self.column = column


def demote_rejection(fault: SinkError) -> SinkError:
    """``fault``, made a plain :class:`SinkError` if it is :class:`RowsRejected`: where no
    rows are being written (opening, connecting, the Parquet key index) a refused value is a
    setup problem, not the data's."""
    return SinkError(str(fault)) if isinstance(fault, RowsRejected) else fault


def check_column_types(
    where: str, have: Mapping[str, str], wanted: Iterable[tuple[str, str]]
) -> None:
    """Raises :class:`TableMismatch` naming the first ``(column, type)`` of ``wanted`` that an
    existing table (its columns' types in ``have``) lacks or holds with another type."""
    for name, kind in wanted:
        if name not in have:
            raise TableMismatch(f"{where} lacks column {name!r} ({kind})", column=name)
        if have[name] != kind:
            raise TableMismatch(
                f"{where}: column {name!r} is {have[name]}, expected {kind}", column=name
            )


def first_line(exc: BaseException) -> str:
    """The first non-empty line of the exception's message (its class name if it has none):
    the database's or store's own words for a sink error, without the context lines."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def table_columns(table: TableSpec) -> tuple[ColumnSpec, ...]:
    """The non-key columns in table order (passthrough, then outputs), after checking names are
    distinct, not reserved, and of a dtype every sink stores."""
    seen: set[str] = set()
    for col in (*table.passthrough, *table.outputs):
        if col.name in RESERVED_COLUMNS:
            raise SinkError(f"column {col.name!r} of table {table.name!r} is a reserved name")
        if col.name in seen:
            raise SinkError(f"column {col.name!r} appears twice in table {table.name!r}")
        seen.add(col.name)
        allowed = VECTOR_DTYPES if col.dim > 0 else SCALAR_DTYPES
        if col.dim < 0 or col.dtype not in allowed:
            kind = f"vector (dim {col.dim})" if col.dim else "scalar"
            raise SinkError(
                f"column {col.name!r}: dtype {col.dtype!r} is not supported for a {kind} "
                f"column; supported: {', '.join(sorted(allowed))}"
            )
    return (*table.passthrough, *table.outputs)


def column_values(rows: ResultRows, col: ColumnSpec) -> NDArray[Any]:
    """The column's array from ``rows``, checked to have one value (or ``dim`` vector) a row."""
    source = rows.passthrough if col.name in rows.passthrough else rows.outputs
    values = source.get(col.name)
    if values is None:
        raise SinkError(f"result rows lack column {col.name!r}")
    want: tuple[int, ...] = (len(rows), col.dim) if col.dim else (len(rows),)
    if values.shape != want:
        raise SinkError(f"column {col.name!r} has shape {values.shape}, expected {want}")
    return values


def null_mask(rows: ResultRows, name: str) -> NDArray[np.bool_] | None:
    """The column's null mask (``True`` = null) when it has a null, else ``None``."""
    mask = rows.nulls.get(name)
    if mask is None or not mask.any():
        return None
    if mask.shape != (len(rows),):
        raise SinkError(f"null mask of {name!r} has shape {mask.shape}, expected ({len(rows)},)")
    return mask


def check_keys(rows: ResultRows) -> None:
    """The key and id arrays have one entry per row."""
    n = len(rows)
    for name in ("row_index", "source_message_id"):
        if getattr(rows, name).shape != (n,):
            raise SinkError(f"{name} has shape {getattr(rows, name).shape}, expected ({n},)")


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


async def finish_on_cancel(work: asyncio.Future[_T]) -> _T:
    """Awaits ``work`` (a thread's); when cancelled, still waits for it to end before
    re-raising, so a sink never has two threads on one connection or file at once."""
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        raise


async def in_thread(func: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``asyncio.to_thread`` that, when cancelled, still waits for the thread's work to end
    (:func:`finish_on_cancel`)."""
    return await finish_on_cancel(asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs)))
