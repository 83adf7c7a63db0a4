"""Vector columns: text cells holding JSON arrays (``[0.1, 0.2]``) or Arrow lists of numbers,
converted to fixed-size float32 vectors, with errors that name the row of a bad cell."""

from __future__ import annotations

import json
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pjson

from rowbatch.tables.errors import InputError, where
from rowbatch.wire.columns.arrow import arrow_type_of
from rowbatch.wire.columns.column_type import ColumnType


def _vector_row(row: object, dim: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    if not isinstance(row, list) or len(row) != dim:
        raise ValueError(f"expected a JSON array of {dim} numbers")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in row):
        raise TypeError("a vector holds numbers only")
    return np.asarray(row, dtype=np.float32)


# Arrow scalars made once: converting Python literals on every call costs import attempts.
_EMPTY: Final = pa.scalar("")
_TRUE: Final = pa.scalar(True)
_JSON_NULL: Final = pa.scalar("null")
_LINE_OPEN: Final = pa.scalar('{"v":')
_LINE_CLOSE: Final = pa.scalar("}\n")
_VECTOR_LINES: Final = pjson.ParseOptions(
    explicit_schema=pa.schema([("v", pa.list_(pa.float32()))]), unexpected_field_behavior="error"
)


def _parse_vectors_fast(arr: pa.Array) -> pa.Array | None:
    """Text cells holding JSON arrays -> list<float32>, parsed by Arrow's JSON reader (one
    ``{"v": <cell>}`` line per cell); None when that fails, for the careful path to explain."""
    if pa.types.is_large_string(arr.type):
        arr = pc.cast(arr, pa.string())
    blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(arr), _EMPTY), _TRUE)
    cells = pc.if_else(blank, _JSON_NULL, arr)
    lines = pc.binary_join_element_wise(_LINE_OPEN, cells, _LINE_CLOSE, _EMPTY)
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    start, stop = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
    data = lines.buffers()[2][start:stop] if stop > start else pa.py_buffer(b"")
    try:
        table = pjson.read_json(
            pa.BufferReader(data),
            read_options=pjson.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1024)),
            parse_options=_VECTOR_LINES,
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(arr):
        return None
    return table.column("v").combine_chunks()


def parse_vectors(arr: pa.Array, dim: int, *, source: str, column: str, first_row: int) -> pa.Array:
    """Text cells holding JSON arrays (``[0.1, 0.2]``) -> fixed-size float32 vectors."""
    parsed = _parse_vectors_fast(arr)
    if parsed is not None:
        return list_to_vector(parsed, dim, source=source, column=column, first_row=first_row)
    n = len(arr)
    values = np.zeros((n, dim), dtype=np.float32)
    nulls = np.zeros(n, dtype=np.bool_)
    for i, text in enumerate(arr.to_pylist()):
        if text is None or not str(text).strip():
            nulls[i] = True
            continue
        try:
            row = json.loads(text)
            values[i] = _vector_row(row, dim)
        except (ValueError, TypeError) as exc:
            raise InputError(
                f"{where(source, column, first_row, i)}: {str(text)[:80]!r} is not a vector "
                f"of {dim} numbers ({exc})"
            ) from None
    flat = pa.array(values.reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(
        flat, type=arrow_type_of(ColumnType.vector(dim)), mask=pa.array(nulls)
    )


def list_to_vector(
    arr: pa.Array, dim: int, *, source: str, column: str, first_row: int
) -> pa.Array:
    target = arrow_type_of(ColumnType.vector(dim))
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    bad = np.flatnonzero(valid & (lengths != dim))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{where(source, column, first_row, row)}: a vector of {int(lengths[row])} "
            f"numbers where {dim} were expected (all rows of a vector column have one length)"
        )
    try:
        return pc.cast(arr, target)
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(
            f"{where(source, column, first_row, None)}: cannot convert to "
            f"vector[float32,{dim}]: {exc}"
        ) from exc


__all__ = ["list_to_vector", "parse_vectors"]
