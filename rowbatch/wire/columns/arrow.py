"""The Arrow side of the column types: which Arrow type a producer writes for each column type,
which Arrow types read as which column type, and the conversions between Arrow arrays and
canonical columns (see docs/wire-format.md, "Column types")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.wire.columns.canonical import Column, has_surrogate, make_column, read_only
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    ColumnType,
    Kind,
    vector_type,
)
from rowbatch.wire.errors import InvalidValue, UnsupportedColumnType

_INT_TYPES: Final = frozenset(
    {pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()}
)
_STRING_TYPES: Final = frozenset({pa.string(), pa.large_string(), pa.string_view()})
_BYTES_TYPES: Final = frozenset({pa.binary(), pa.large_binary(), pa.binary_view()})


def arrow_type_of(ctype: ColumnType) -> pa.DataType:
    """The Arrow type a producer writes for ``ctype``."""
    if ctype.kind is Kind.VECTOR:
        return pa.list_(pa.field("item", pa.float32()), ctype.dim)
    return {
        Kind.INT64: pa.int64(),
        Kind.FLOAT32: pa.float32(),
        Kind.FLOAT64: pa.float64(),
        Kind.BOOL: pa.bool_(),
        Kind.STRING: pa.string(),
        Kind.BYTES: pa.binary(),
    }[ctype.kind]


_ARROW_SIMPLE: Final[Mapping[pa.DataType, ColumnType]] = {
    pa.float32(): FLOAT32,
    pa.float64(): FLOAT64,
    pa.bool_(): BOOL,
    **dict.fromkeys(_INT_TYPES, INT64),
    **dict.fromkeys(_STRING_TYPES, STRING),
    **dict.fromkeys(_BYTES_TYPES, BYTES),
}


def column_type_of_arrow(name: str, atype: pa.DataType) -> ColumnType:
    """Maps an Arrow type to a column type (see docs/wire-format.md, "Arrow types")."""
    if pa.types.is_dictionary(atype):
        atype = atype.value_type
    simple = _ARROW_SIMPLE.get(atype)
    if simple is not None:
        return simple
    if pa.types.is_fixed_size_list(atype) and atype.value_type == pa.float32():
        return vector_type(name, atype.list_size)
    raise UnsupportedColumnType(
        f"column {name!r}: Arrow type {atype} is not part of the contract (use int64, float32, "
        "float64, bool, utf8, binary or fixed_size_list<float32>[dim])",
        column=name,
        expected="int64|float32|float64|bool|utf8|binary|fixed_size_list<float32>",
        found=str(atype),
    )


def arrow_to_column(name: str, data: pa.Array | pa.ChunkedArray) -> Column:
    """Arrow column -> canonical column; numeric columns without nulls are zero-copy views."""
    return arrow_to_column_of_type(name, data, column_type_of_arrow(name, data.type))


def arrow_to_column_of_type(
    name: str, data: pa.Array | pa.ChunkedArray, ctype: ColumnType
) -> Column:
    """:func:`arrow_to_column` for data whose column type is known to be ``ctype`` (that is,
    ``column_type_of_arrow(name, data.type) == ctype``)."""
    arr = data
    if isinstance(data, pa.ChunkedArray):
        arr = data.chunk(0) if data.num_chunks == 1 else data.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    nulls: NDArray[np.bool_] | None = None
    if arr.null_count:
        nulls = cast("NDArray[np.bool_]", arr.is_null().to_numpy(zero_copy_only=False))
    values: NDArray[Any]
    if ctype.kind is Kind.VECTOR:
        dim = cast("int", ctype.dim)
        flat = arr.values.slice(arr.offset * dim, n * dim)
        if flat.null_count:
            child_nulls = flat.is_null().to_numpy(zero_copy_only=False).reshape(n, dim)
            if nulls is not None:
                child_nulls &= ~nulls[:, None]
            if child_nulls.any():
                row = int(np.argmax(child_nulls.any(axis=1)))
                raise InvalidValue(
                    f"column {name!r} ({ctype}): row {row} has a null element; a vector row "
                    "is null as a whole or not at all",
                    column=name,
                    expected="no null elements",
                    found=f"null element in row {row}",
                )
            flat = flat.fill_null(0.0)
        values = flat.to_numpy(zero_copy_only=False).reshape(n, dim)
    elif ctype.kind in (Kind.STRING, Kind.BYTES):
        values = arr.to_numpy(zero_copy_only=False)
    else:
        if nulls is not None:
            arr = arr.fill_null(False if ctype.kind is Kind.BOOL else 0)
        values = arr.to_numpy(zero_copy_only=False)
        if values.dtype != ctype.numpy_dtype:
            values = values.astype(ctype.numpy_dtype)
    return make_column(name, values, ctype, nulls)


ArrowConverter: TypeAlias = "Callable[[str, pa.Array], Column]"


def arrow_converter(ctype: ColumnType, atype: pa.DataType) -> ArrowConverter:
    """``arrow_to_column_of_type(name, arr, ctype)`` for arrays of Arrow type ``atype``, with
    a shorter path for the common cases (numeric columns and vectors without nulls, in the
    types producers write); anything else goes the general way."""

    def general(name: str, arr: pa.Array) -> Column:
        return arrow_to_column_of_type(name, arr, ctype)

    if ctype.kind in (Kind.INT64, Kind.FLOAT32, Kind.FLOAT64) and atype == arrow_type_of(ctype):

        def numeric(name: str, arr: pa.Array) -> Column:
            if arr.null_count:
                return general(name, arr)
            return Column(name, ctype, read_only(arr.to_numpy(zero_copy_only=False)))

        return numeric
    if ctype.kind is Kind.VECTOR and pa.types.is_fixed_size_list(atype):
        dim = cast("int", ctype.dim)

        def vector(name: str, arr: pa.Array) -> Column:
            n = len(arr)
            flat = arr.values.slice(arr.offset * dim, n * dim)
            if arr.null_count or flat.null_count:
                return general(name, arr)
            values = flat.to_numpy(zero_copy_only=False).reshape(n, dim)
            return Column(name, ctype, read_only(values))

        return vector
    return general


def column_to_arrow(col: Column) -> pa.Array:
    """Canonical column -> Arrow array of the contract's type for it."""
    mask = None if col.nulls is None else pa.array(col.nulls, type=pa.bool_())
    atype = arrow_type_of(col.type)
    if col.type.kind is Kind.VECTOR:
        flat = pa.array(np.ascontiguousarray(col.values).reshape(-1), type=pa.float32())
        return pa.FixedSizeListArray.from_arrays(flat, type=atype, mask=mask)
    if col.type.kind in (Kind.STRING, Kind.BYTES):
        try:
            return pa.array(col.values, type=atype)
        except UnicodeEncodeError as exc:
            row = next(i for i, v in enumerate(col.values) if has_surrogate(v))
            raise InvalidValue(
                f"column {col.name!r}: row {row} is not encodable as UTF-8 ({exc.reason})",
                column=col.name,
                expected="valid Unicode text",
                found=repr(col.values[row])[:80],
            ) from exc
    return pa.array(col.values, type=atype, mask=col.nulls)
