"""Result rows as SQLite parameter tuples: vectors as little-endian BLOBs, bools as 0/1,
``processed_at`` as ISO-8601 text, ``None`` where null."""

from __future__ import annotations

from typing import Any

import numpy as np

from rowbatch.consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    ResultRows,
    TableSpec,
    check_keys,
    column_values,
    null_mask,
    table_columns,
    utc,
)


def _column_cells(rows: ResultRows, col: ColumnSpec) -> list[Any]:
    """The column as a list of SQLite values, ``None`` where null."""
    values = column_values(rows, col)
    cells: list[Any]
    if col.dim:
        dtype = np.dtype("u1") if col.dtype == "bool" else np.dtype(col.dtype).newbyteorder("<")
        blob = np.ascontiguousarray(values, dtype=dtype).tobytes()
        width = col.dim * dtype.itemsize
        cells = [blob[i : i + width] for i in range(0, len(blob), width)]
    elif col.dtype in TEXT_DTYPES or col.dtype == "bytes":
        cells = list(values)
    elif col.dtype == "bool":
        cells = values.astype(np.int64).tolist()
    else:
        cells = values.tolist()
    mask = null_mask(rows, col.name)
    if mask is not None:
        for i in np.flatnonzero(mask).tolist():
            cells[i] = None
    return cells


def records(table: TableSpec, rows: ResultRows) -> list[tuple[Any, ...]]:
    """One parameter tuple per row, in :func:`~rowbatch.consumer.sinks.sqlite.table.layout`
    order."""
    check_keys(rows)
    at = utc(rows.processed_at).isoformat(timespec="microseconds")
    columns: list[list[Any]] = [
        list(rows.chunk_id),
        rows.row_index.tolist(),
        list(rows.source_message_id),
        *(_column_cells(rows, c) for c in table_columns(table)),
    ]
    tail = (rows.model_name, rows.model_version, at)
    return [(*r, *tail) for r in zip(*columns, strict=True)]
