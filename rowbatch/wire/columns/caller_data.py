"""Caller data -> canonical columns (:func:`to_column`): numpy arrays (masked arrays mark
nulls), pyarrow arrays or sequences of Python values, with the column type inferred where the
caller gives none and every value checked against it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.wire.columns.arrow import arrow_to_column
from rowbatch.wire.columns.canonical import Column, check_column_name, checked_float32, make_column
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    INT64_MAX,
    INT64_MIN,
    STRING,
    ColumnType,
    Kind,
    vector_type,
)
from rowbatch.wire.errors import ColumnTypeMismatch, InvalidValue, UnsupportedColumnType

#: What :func:`~rowbatch.wire.chunks.encode.encode_chunk` accepts for one column: a numpy array
#: (masked arrays mark nulls), a pyarrow Array/ChunkedArray, or a sequence of Python values
#: (``None`` = null).
ColumnData: TypeAlias = "NDArray[Any] | Sequence[Any] | pa.Array | pa.ChunkedArray"


def _name_types(values: Iterable[object]) -> str:
    return ", ".join(sorted({type(v).__name__ for v in values}))


def _first_bad(values: Sequence[object], ok: tuple[type, ...], exclude_bool: bool) -> int:
    for i, v in enumerate(values):
        if v is None:
            continue
        if not isinstance(v, ok) or (exclude_bool and isinstance(v, bool | np.bool_)):
            return i
    return -1


def _type_mismatch(name: str, ctype: ColumnType, row: int, value: object) -> ColumnTypeMismatch:
    return ColumnTypeMismatch(
        f"column {name!r} ({ctype}): row {row} holds {type(value).__name__} {value!r:.80}",
        column=name,
        expected=str(ctype),
        found=type(value).__name__,
    )


_NUMBERS: Final = (int, float, np.integer, np.floating)
# Order matters: bool is a subclass of int.
_CLASSES: Final[tuple[tuple[str, tuple[type, ...]], ...]] = (
    ("bool", (bool, np.bool_)),
    ("int", (int, np.integer)),
    ("float", (float, np.floating)),
    ("str", (str,)),
    ("bytes", (bytes, bytearray, memoryview)),
    ("vector", (list, tuple, np.ndarray)),
)
_SIMPLE_INFERENCE: Final[Mapping[frozenset[str], ColumnType]] = {
    frozenset({"bool"}): BOOL,
    frozenset({"int"}): INT64,
    frozenset({"float"}): FLOAT64,
    frozenset({"int", "float"}): FLOAT64,
    frozenset({"str"}): STRING,
    frozenset({"bytes"}): BYTES,
}
# kind -> (accepted Python/numpy scalar types, whether bools are refused)
_SCALAR_TYPES: Final[Mapping[Kind, tuple[tuple[type, ...], bool]]] = {
    Kind.BOOL: ((bool, np.bool_), False),
    Kind.INT64: ((int, np.integer), True),
    Kind.FLOAT32: (_NUMBERS, True),
    Kind.FLOAT64: (_NUMBERS, True),
}


def _classify(value: object) -> str:
    for label, classes in _CLASSES:
        if isinstance(value, classes):
            return label
    return type(value).__name__


def _infer_type(name: str, values: Sequence[object]) -> ColumnType:
    kinds = frozenset(_classify(v) for v in values if v is not None)
    if not kinds:
        raise UnsupportedColumnType(
            f"column {name!r}: cannot infer a type from {len(values)} null/empty value(s); "
            "pass its type in the schema",
            column=name,
            expected="a schema entry",
            found="no non-null values",
        )
    simple = _SIMPLE_INFERENCE.get(kinds)
    if simple is not None:
        return simple
    if kinds == {"vector"}:
        first = next(v for v in values if v is not None)
        return vector_type(name, len(cast("Sequence[object]", first)))
    raise UnsupportedColumnType(
        f"column {name!r}: cannot map values of type(s) {_name_types(values)} to a column type; "
        "use int, float, bool, str, bytes or equal-length numeric sequences (vectors)",
        column=name,
        found=_name_types(values),
    )


def _from_sequence(
    name: str, values: Sequence[object], ctype: ColumnType | None
) -> tuple[NDArray[Any], NDArray[np.bool_] | None, ColumnType]:
    ctype = ctype if ctype is not None else _infer_type(name, values)
    nulls = np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values))
    if ctype.kind in (Kind.STRING, Kind.BYTES):
        out = _text_from_sequence(name, ctype, values)
    elif ctype.kind is Kind.VECTOR:
        out = _vectors_from_sequence(name, ctype, values)
    else:
        out = _scalars_from_sequence(name, ctype, values, bool(nulls.any()))
    return out, nulls if nulls.any() else None, ctype


def _text_from_sequence(name: str, ctype: ColumnType, values: Sequence[object]) -> NDArray[Any]:
    ok: tuple[type, ...] = (str,) if ctype.kind is Kind.STRING else (bytes, bytearray, memoryview)
    bad = _first_bad(values, ok, exclude_bool=False)
    if bad >= 0:
        raise _type_mismatch(name, ctype, bad, values[bad])
    out = np.empty(len(values), dtype=object)
    if ctype.kind is Kind.BYTES:
        out[:] = [None if v is None else bytes(cast("bytes", v)) for v in values]
    else:
        out[:] = values
    return out


def _vectors_from_sequence(
    name: str, ctype: ColumnType, values: Sequence[object]
) -> NDArray[np.float32]:
    dim = cast("int", ctype.dim)
    rows: list[object] = []
    for i, v in enumerate(values):
        if v is None:
            rows.append([0.0] * dim)
            continue
        if _classify(v) != "vector":
            raise _type_mismatch(name, ctype, i, v)
        row = cast("Sequence[object]", v)
        if len(row) != dim:
            raise ColumnTypeMismatch(
                f"column {name!r} ({ctype}): row {i} has {len(row)} elements, expected {dim}",
                column=name,
                expected=str(ctype),
                found=f"{len(row)} elements",
            )
        numeric_array = isinstance(row, np.ndarray) and row.ndim == 1 and row.dtype.kind in "iuf"
        j = -1 if numeric_array else _first_bad(row, _NUMBERS, exclude_bool=True)
        if j >= 0:
            raise ColumnTypeMismatch(
                f"column {name!r} ({ctype}): row {i} element {j} is "
                f"{type(row[j]).__name__} {row[j]!r:.80}",
                column=name,
                expected="numbers",
                found=type(row[j]).__name__,
            )
        rows.append(row)
    try:
        wide = np.array(rows, dtype=np.float64).reshape(len(values), dim)
    except OverflowError as exc:
        raise InvalidValue(
            f"column {name!r}: {exc}", column=name, expected=str(ctype), found="huge int"
        ) from exc
    return checked_float32(name, wide)


def _scalars_from_sequence(
    name: str, ctype: ColumnType, values: Sequence[object], has_nulls: bool
) -> NDArray[Any]:
    ok, exclude_bool = _SCALAR_TYPES[ctype.kind]
    bad = _first_bad(values, ok, exclude_bool)
    if bad >= 0:
        raise _type_mismatch(name, ctype, bad, values[bad])
    filled = [0 if v is None else v for v in values] if has_nulls else list(values)
    if ctype.kind is Kind.INT64:
        for i, v in enumerate(filled):
            if not INT64_MIN <= cast("int", v) <= INT64_MAX:
                raise InvalidValue(
                    f"column {name!r}: value {v} at row {i} is out of int64 range",
                    column=name,
                    expected="int64",
                    found=str(v),
                )
    dtype = np.float64 if ctype.kind is Kind.FLOAT32 else ctype.numpy_dtype
    try:
        out = np.array(filled, dtype=dtype).reshape(len(values))
    except OverflowError as exc:  # an int beyond float64
        raise InvalidValue(
            f"column {name!r}: {exc}", column=name, expected=str(ctype), found="huge int"
        ) from exc
    return checked_float32(name, out) if ctype.kind is Kind.FLOAT32 else out


_DTYPE_KINDS: Final[Mapping[str, ColumnType]] = {
    "b": BOOL,
    "i": INT64,
    "u": INT64,
    "U": STRING,
    "S": BYTES,
}


def _dtype_type(name: str, arr: NDArray[Any]) -> ColumnType:
    kind, ndim, size = arr.dtype.kind, arr.ndim, arr.dtype.itemsize
    found: ColumnType | None = None
    if ndim == 2 and kind in "iuf" and size <= 8 and arr.shape[1] >= 1:
        found = vector_type(name, arr.shape[1])
    elif ndim == 1 and kind == "f":
        found = {2: FLOAT32, 4: FLOAT32, 8: FLOAT64}.get(size)
    elif ndim == 1:
        found = _DTYPE_KINDS.get(kind)
    if found is None:
        raise UnsupportedColumnType(
            f"column {name!r}: cannot map a {ndim}-D numpy array of dtype {arr.dtype} (shape "
            f"{arr.shape}) to a column type (supported: 1-D bool/int/float/str/bytes/object, "
            "2-D numeric with >= 1 column = vector)",
            column=name,
            found=f"{ndim}-D {arr.dtype}",
        )
    return found


def _from_ndarray(
    name: str, arr: NDArray[Any], mask: NDArray[np.bool_] | None, ctype: ColumnType | None
) -> tuple[NDArray[Any], NDArray[np.bool_] | None, ColumnType]:
    if arr.dtype.kind == "O" and arr.ndim == 1:
        seq_values, nulls, ctype = _from_sequence(name, cast("Sequence[object]", arr), ctype)
        return seq_values, _merge(nulls, mask), ctype
    if arr.ndim == 2 and mask is not None and mask.ndim == 2:
        row_mask = mask.all(axis=1)
        partial = mask.any(axis=1) & ~row_mask
        if partial.any():
            row = int(np.argmax(partial))
            raise InvalidValue(
                f"column {name!r}: row {row} masks only some vector elements; a vector row is "
                "null as a whole or not at all",
                column=name,
                expected="whole-row mask",
                found="partial mask",
            )
        mask = np.asarray(row_mask)
    inferred = _dtype_type(name, arr)
    if ctype is None:
        ctype = inferred
    kind = ctype.kind
    compatible = (
        inferred == ctype
        or (kind in (Kind.FLOAT32, Kind.FLOAT64) and inferred.kind in (Kind.INT64, Kind.FLOAT32))
        or (kind is Kind.FLOAT32 and inferred.kind is Kind.FLOAT64)
    )
    if not compatible:
        raise ColumnTypeMismatch(
            f"column {name!r}: declared {ctype}, but the data is a {arr.ndim}-D numpy array of "
            f"dtype {arr.dtype} ({inferred})",
            column=name,
            expected=str(ctype),
            found=str(inferred),
        )
    values: NDArray[Any]
    if kind is Kind.INT64:
        if arr.dtype == np.uint64 and arr.size and int(arr.max()) > INT64_MAX:
            row = int(np.argmax(arr > INT64_MAX))
            raise InvalidValue(
                f"column {name!r}: value {arr[row]} at row {row} is out of int64 range",
                column=name,
                expected="int64",
                found=str(arr[row]),
            )
        values = arr.astype(np.int64, copy=False)
    elif kind in (Kind.FLOAT32, Kind.VECTOR):
        values = checked_float32(name, arr) if arr.dtype != np.float32 else arr
    elif kind in (Kind.STRING, Kind.BYTES):
        values = arr.astype(object)
    else:
        values = arr.astype(ctype.numpy_dtype, copy=False)
    return values, mask, ctype


def _merge(a: NDArray[np.bool_] | None, b: NDArray[np.bool_] | None) -> NDArray[np.bool_] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def to_column(
    name: str,
    data: ColumnData,
    ctype: ColumnType | None = None,
    null_mask: NDArray[np.bool_] | Sequence[bool] | None = None,
) -> Column:
    """Converts caller data to a canonical :class:`Column`, inferring the type unless ``ctype``
    is given. Raises UnsupportedColumnType, ColumnTypeMismatch or InvalidValue."""
    check_column_name(name)
    values: NDArray[Any]
    nulls: NDArray[np.bool_] | None
    if isinstance(data, pa.ChunkedArray | pa.Array):
        col = arrow_to_column(name, data)
        if ctype is not None and col.type != ctype:
            raise ColumnTypeMismatch(
                f"column {name!r}: declared {ctype}, but the Arrow data is {data.type} "
                f"({col.type})",
                column=name,
                expected=str(ctype),
                found=str(col.type),
            )
        values, nulls, ctype = col.values, col.nulls, col.type
    elif isinstance(data, np.ndarray):
        mask = None
        if isinstance(data, np.ma.MaskedArray):
            mask = np.broadcast_to(np.asarray(data.mask, dtype=np.bool_), data.shape)
            data = np.asarray(data.data)
        values, nulls, ctype = _from_ndarray(name, data, mask, ctype)
    elif isinstance(data, str | bytes | bytearray | Mapping) or not isinstance(data, Sequence):
        raise UnsupportedColumnType(
            f"column {name!r}: expected a numpy array, a pyarrow array or a sequence of values, "
            f"found {type(data).__name__}",
            column=name,
            expected="array or sequence",
            found=type(data).__name__,
        )
    else:
        values, nulls, ctype = _from_sequence(name, data, ctype)
    if null_mask is not None:
        extra = np.asarray(null_mask, dtype=np.bool_)
        if extra.shape != (values.shape[0],):
            raise InvalidValue(
                f"column {name!r}: null mask has shape {extra.shape}, expected "
                f"({values.shape[0]},)",
                column=name,
                expected=f"({values.shape[0]},)",
                found=str(extra.shape),
            )
        nulls = _merge(nulls, extra)
    if nulls is not None:
        nulls = np.array(nulls, dtype=np.bool_)  # own copy: make_column freezes it
    return make_column(name, values, ctype, nulls)
