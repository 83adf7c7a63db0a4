"""Result rows as Arrow tables: the dataset's schema, the conversion of a batch, and the check
of a stored schema against the spec."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    ResultRows,
    RowsRejected,
    SinkError,
    TableMismatch,
    TableSpec,
    check_column_types,
    check_keys,
    column_values,
    first_line,
    null_mask,
    table_columns,
    utc,
)
from rowbatch.consumer.sinks.parquet.files import PARTITION

_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")


def _arrow_type(col: ColumnSpec) -> pa.DataType:
    if col.dtype in TEXT_DTYPES:
        base = pa.string()
    elif col.dtype == "bytes":
        base = pa.binary()
    elif col.dtype == "float16":
        base = pa.float32()
    else:
        base = pa.from_numpy_dtype(np.dtype(col.dtype))
    # "element" is what Parquet's compliant nested types call it, so files read back the same
    return pa.list_(pa.field("element", base), col.dim) if col.dim else base


def arrow_schema(table: TableSpec) -> pa.Schema:
    """The schema of every file of the dataset (without the ``processed_date`` partition)."""
    columns = table_columns(table)
    for col in columns:
        if col.name == PARTITION:
            raise SinkError(f"column {PARTITION!r} is the Parquet sink's partition column")
    return pa.schema(
        [
            pa.field("chunk_id", pa.string(), nullable=False),
            pa.field("row_index", pa.int64(), nullable=False),
            pa.field("source_message_id", pa.string()),
            *(pa.field(c.name, _arrow_type(c)) for c in columns),
            pa.field("model_name", pa.string()),
            pa.field("model_version", pa.string()),
            pa.field("processed_at", _TIMESTAMP),
        ]
    )


def _refused(name: str, kind: pa.DataType, exc: Exception) -> RowsRejected:
    return RowsRejected(
        f"Parquet sink: column {name!r}: pyarrow cannot store a value as {kind}: {first_line(exc)}"
    )


def _column(rows: ResultRows, col: ColumnSpec, kind: pa.DataType) -> pa.Array:
    values = column_values(rows, col)
    try:
        return _convert(values, rows, col, kind)
    except (TypeError, ValueError, OverflowError, pa.ArrowNotImplementedError) as exc:
        raise _refused(col.name, kind, exc) from exc


def _convert(
    values: NDArray[Any], rows: ResultRows, col: ColumnSpec, kind: pa.DataType
) -> pa.Array:
    mask = null_mask(rows, col.name)
    if col.dtype in TEXT_DTYPES or col.dtype == "bytes":
        return pa.array(values, type=kind, mask=mask)
    stored = np.dtype("float32" if col.dtype == "float16" else col.dtype)
    if not col.dim:
        return pa.array(values.astype(stored, copy=False), type=kind, mask=mask)
    flat = np.ascontiguousarray(values, dtype=stored).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(
        pa.array(flat, type=kind.value_type),
        col.dim,
        mask=None if mask is None else pa.array(mask),
    )


def _key(values: NDArray[Any], name: str, kind: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=kind)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _refused(name, kind, exc) from exc


def to_arrow(table: TableSpec, schema: pa.Schema, rows: ResultRows) -> pa.Table:
    """The rows as a table of ``schema`` (:func:`arrow_schema` of ``table``); a value pyarrow
    cannot convert to its column's type raises :class:`RowsRejected` naming the column."""
    check_keys(rows)
    n = len(rows)
    at = np.datetime64(utc(rows.processed_at).replace(tzinfo=None), "us")
    arrays = [
        _key(rows.chunk_id, "chunk_id", pa.string()),
        _key(rows.row_index, "row_index", pa.int64()),
        _key(rows.source_message_id, "source_message_id", pa.string()),
        *(_column(rows, c, schema.field(c.name).type) for c in table_columns(table)),
        pa.repeat(pa.scalar(rows.model_name, pa.string()), n),
        pa.repeat(pa.scalar(rows.model_version, pa.string()), n),
        pa.array(np.full(n, at), type=_TIMESTAMP),
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _type_name(kind: pa.DataType) -> str:
    """The type without nested field names (readers call a list's element differently)."""
    if pa.types.is_fixed_size_list(kind):
        return f"{_type_name(kind.value_type)}[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_name(kind.value_type)}>"
    return str(kind)


def describe_schema(schema: pa.Schema) -> list[tuple[str, str]]:
    """``(column, type)`` of each field, in a form that compares across readers and writers
    (the key index records the dataset's schema so)."""
    return [(f.name, _type_name(f.type)) for f in schema]


def check_schema(where: str, stored: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> None:
    """Raises TableMismatch naming the first column where the dataset and the spec differ."""
    check_column_types(where, dict(stored), wanted)
    known = {name for name, _ in wanted}
    extra = [name for name, _ in stored if name not in known]
    if extra:
        raise TableMismatch(f"{where} has column {extra[0]!r} the spec lacks", column=extra[0])
