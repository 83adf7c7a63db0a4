"""Result columns in PostgreSQL: each one's SQL type and its encoding in the binary ``COPY``
format, vectorised with numpy (one ``COPY`` tuple per result row)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain, repeat
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    ResultRows,
    SinkError,
    TableSpec,
    column_values,
    null_mask,
    table_columns,
    utc,
)

#: What a binary ``COPY`` stream starts with (signature, flags, header extension length) and
#: ends with.
SIGNATURE: Final = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER: Final = b"\xff\xff"
_NULL: Final = b"\xff\xff\xff\xff"
_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)

# numpy dtype -> (format_type name, big-endian binary format, element type oid)
_NUMERIC: Final[dict[str, tuple[str, str, int]]] = {
    "bool": ("boolean", "?", 16),
    **dict.fromkeys(("int8", "int16", "int32", "int64"), ("bigint", ">i8", 20)),
    **dict.fromkeys(("uint8", "uint16", "uint32"), ("bigint", ">i8", 20)),
    "float16": ("real", ">f4", 700),
    "float32": ("real", ">f4", 700),
    "float64": ("double precision", ">f8", 701),
}

Cells = Sequence[bytes | memoryview]  # one binary COPY field (length prefix included) per row


@dataclass(frozen=True)
class PgColumn:
    """A passthrough or output column as the sink stores it."""

    name: str
    pg_type: str  # as format_type() spells it, so it doubles as the check
    encode: Callable[[ResultRows, slice], Cells]
    spec: ColumnSpec

    @property
    def dim(self) -> int:
        return self.spec.dim


def pg_type(col: ColumnSpec) -> str:
    """The column's SQL type, as ``format_type()`` spells it."""
    if col.dtype in TEXT_DTYPES:
        return "text"
    if col.dtype == "bytes":
        return "bytea"
    base = _NUMERIC[col.dtype][0]
    return f"{base}[]" if col.dim else base


def pg_columns(table: TableSpec) -> tuple[PgColumn, ...]:
    """The table's non-key columns (checked by :func:`table_columns`), typed and encodable."""
    return tuple(PgColumn(c.name, pg_type(c), column_encoder(c), c) for c in table_columns(table))


def _split(records: NDArray[Any], mask: NDArray[np.bool_] | None) -> list[bytes | memoryview]:
    buf = memoryview(records.view(np.uint8).reshape(-1).data)  # slices are views: no copies
    width = records.dtype.itemsize
    cells: list[bytes | memoryview] = [buf[i : i + width] for i in range(0, len(buf), width)]
    if mask is not None:
        for i in np.flatnonzero(mask).tolist():
            cells[i] = _NULL
    return cells


def column_encoder(col: ColumnSpec) -> Callable[[ResultRows, slice], Cells]:
    """The column's ``COPY`` fields for a slice of the rows (``NULL`` where masked)."""

    def encode(rows: ResultRows, part: slice) -> Cells:
        values = column_values(rows, col)[part]
        mask = null_mask(rows, col.name)
        mask = None if mask is None else mask[part]
        if col.dtype in TEXT_DTYPES or col.dtype == "bytes":
            return _varlen_cells(col.name, values, mask, text=col.dtype != "bytes")
        _, fmt, oid = _NUMERIC[col.dtype]
        size = np.dtype(fmt).itemsize
        if col.dim == 0:
            records = np.empty(len(values), dtype=[("len", ">i4"), ("v", fmt)])
            records["len"] = size
            records["v"] = values
            return _split(records, mask)
        element = np.dtype([("len", ">i4"), ("v", fmt)])
        layout = np.dtype([("len", ">i4"), ("head", ">i4", (5,)), ("e", element, (col.dim,))])
        records = np.empty(len(values), dtype=layout)
        records["len"] = layout.itemsize - 4
        records["head"] = (1, 0, oid, col.dim, 1)  # ndim, has-nulls, element oid, size, lbound
        records["e"]["len"] = size
        records["e"]["v"] = values
        return _split(records, mask)

    return encode


def _varlen_cells(
    name: str, values: NDArray[Any], mask: NDArray[np.bool_] | None, *, text: bool
) -> list[bytes]:
    items = values.tolist()
    if mask is None and text and set(map(type, items)) <= {str}:
        # Keys repeat (one chunk id per message): encode each distinct value once.
        distinct = {value: _text(value) for value in set(items)}
        return list(map(distinct.__getitem__, items))
    pack = struct.Struct(">i").pack
    want = str if text else bytes
    cells: list[bytes] = []
    nulls = mask.tolist() if mask is not None else repeat(False, len(values))
    for i, (value, null) in enumerate(zip(values.tolist(), nulls, strict=False)):
        if null:
            cells.append(_NULL)
            continue
        if not isinstance(value, want):
            raise SinkError(
                f"column {name!r} row {i}: expected {want.__name__}, found {type(value).__name__}"
            )
        data = value.encode() if isinstance(value, str) else value
        cells.append(pack(len(data)) + data)
    return cells


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def _key_cells(rows: ResultRows, part: slice) -> list[Cells]:
    index = np.empty(len(rows.row_index[part]), dtype=[("len", ">i4"), ("v", ">i8")])
    index["len"] = 8
    index["v"] = rows.row_index[part]
    return [
        _varlen_cells("chunk_id", rows.chunk_id[part], None, text=True),
        _split(index, None),
        _varlen_cells("source_message_id", rows.source_message_id[part], None, text=True),
    ]


def encode_tuples(columns: Sequence[PgColumn], rows: ResultRows, part: slice) -> bytes:
    """The binary COPY tuples of ``rows[part]`` (without the signature and trailer)."""
    n = len(rows.row_index[part])
    micros = (utc(rows.processed_at) - _PG_EPOCH) // timedelta(microseconds=1)
    tail = _text(rows.model_name) + _text(rows.model_version) + struct.pack(">iq", 8, micros)
    fields: list[Any] = [
        repeat(struct.pack(">h", len(columns) + 6), n),
        *_key_cells(rows, part),
        *(c.encode(rows, part) for c in columns),
        repeat(tail, n),
    ]
    return b"".join(chain.from_iterable(zip(*fields, strict=False)))
