"""Converting a table read from the input to the columns
:func:`~rowbatch.wire.chunks.split.split_rows` takes: columns named in the declared schema
(``--schema``) are cast to its type, others get the type their values have; errors name the
input, the column and the data row."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from rowbatch.tables.errors import InputError, where
from rowbatch.tables.vectors import list_to_vector, parse_vectors
from rowbatch.wire.columns.arrow import arrow_type_of, column_type_of_arrow
from rowbatch.wire.columns.column_type import ColumnType, Kind
from rowbatch.wire.errors import UnsupportedColumnType


def _first_failing_row(arr: pa.Array, convert: Callable[[pa.Array], object]) -> int | None:
    """The first row whose conversion fails: the shortest failing prefix, by bisection."""

    def fails(length: int) -> bool:
        try:
            convert(arr.slice(0, length))
        except (pa.ArrowException, ValueError, TypeError):
            return True
        return False

    lo, hi = 0, len(arr)  # arr[:lo] converts, arr[:hi] does not
    if not fails(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi - 1


def _is_list(atype: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(atype)
        or pa.types.is_large_list(atype)
        or pa.types.is_fixed_size_list(atype)
    )


def _is_text(atype: pa.DataType) -> bool:
    return bool(pa.types.is_string(atype) or pa.types.is_large_string(atype))


def _infer(
    arr: pa.Array, *, source: str, column: str, first_row: int
) -> tuple[pa.Array, ColumnType]:
    atype = arr.type
    if pa.types.is_null(atype):
        raise InputError(
            f"{where(source, column, first_row, None)}: every value in data rows "
            f"{first_row + 1}..{first_row + len(arr)} is empty, so its type cannot be inferred; "
            f"declare it with --schema {column}:TYPE"
        )
    if pa.types.is_float16(atype):
        return pc.cast(arr, pa.float32()), ColumnType(Kind.FLOAT32)
    if (
        pa.types.is_list(atype)
        or pa.types.is_large_list(atype)
        or pa.types.is_fixed_size_list(atype)
    ) and (pa.types.is_integer(atype.value_type) or pa.types.is_floating(atype.value_type)):
        lengths = pc.list_value_length(arr).drop_null()
        if len(lengths) == 0:
            raise InputError(
                f"{where(source, column, first_row, None)}: only null vectors in data rows "
                f"{first_row + 1}..{first_row + len(arr)}: declare it with --schema "
                f"{column}:vector[float32,DIM]"
            )
        dim = int(lengths[0].as_py())
        if dim < 1:
            raise InputError(f"{where(source, column, first_row, None)}: an empty vector")
        ctype = ColumnType.vector(dim)
        return list_to_vector(arr, dim, source=source, column=column, first_row=first_row), ctype
    try:
        return arr, column_type_of_arrow(column, atype)
    except UnsupportedColumnType:
        raise InputError(
            f"{where(source, column, first_row, None)}: its type {atype} (as read from the "
            "input) is not a rowbatch column type (int64, float32, float64, bool, string, "
            "bytes, vector[float32,D]); declare it with --schema, e.g. "
            f"--schema {column}:string, or convert it before publishing"
        ) from None


def _convert(
    arr: pa.Array, ctype: ColumnType, *, source: str, column: str, first_row: int
) -> pa.Array:
    atype = arr.type
    if pa.types.is_dictionary(atype):
        arr = arr.dictionary_decode()
        atype = arr.type
    if ctype.kind is Kind.VECTOR:
        dim = ctype.dim or 0
        if _is_text(atype):
            return parse_vectors(arr, dim, source=source, column=column, first_row=first_row)
        if _is_list(atype):
            return list_to_vector(arr, dim, source=source, column=column, first_row=first_row)
    elif ctype.kind is Kind.BYTES and _is_text(atype):
        return pc.cast(arr, pa.binary())
    target = arrow_type_of(ctype)
    if atype == target:
        return arr
    try:
        return pc.cast(arr, target)
    except (pa.ArrowException, ValueError) as exc:
        row = _first_failing_row(arr, lambda a: pc.cast(a, target))
        value = "" if row is None else f": {arr[row].as_py()!r:.80}"
        raise InputError(
            f"{where(source, column, first_row, row)}: cannot convert {atype} to {ctype}"
            f"{value} ({' '.join(str(exc).split())})"
        ) from exc


def wire_columns(
    table: pa.Table,
    schema: Mapping[str, ColumnType] | None = None,
    *,
    source: str = "input",
    first_row: int = 0,
) -> tuple[dict[str, pa.Array], dict[str, ColumnType]]:
    """The columns of ``table`` as Arrow arrays of the wire types, and those types.

    Columns named in ``schema`` are converted to its type (an error names the row that does not
    convert); others get the type their values have, if the wire format has one. ``first_row``
    is the table's position in the input (for messages)."""
    declared = schema or {}
    missing = [name for name in declared if name not in table.column_names]
    if missing:
        raise InputError(
            f"{source}: --schema names column(s) {missing} that the input lacks "
            f"(it has {table.column_names})"
        )
    columns: dict[str, pa.Array] = {}
    types: dict[str, ColumnType] = {}
    for name, chunked in zip(table.column_names, table.columns, strict=True):
        if name in columns:
            raise InputError(f"{source}: column {name!r} appears more than once")
        arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        if name in declared:
            ctype = declared[name]
            arr = _convert(arr, ctype, source=source, column=name, first_row=first_row)
        else:
            arr, ctype = _infer(arr, source=source, column=name, first_row=first_row)
        columns[name] = arr
        types[name] = ctype
    return columns, types


__all__ = ["wire_columns"]
