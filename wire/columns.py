"""Column types of the wire contract and the conversions between caller data, the canonical
numpy form that :func:`wire.chunks.decode_chunk` returns, and Arrow arrays.

Canonical numpy form of a column (``Column.values``), one entry per row:

==========  ==================================  ===============================
kind        numpy array                         value at a null row
==========  ==================================  ===============================
int64       1-D ``int64``                       ``0``
float32     1-D ``float32``                     ``0.0``
float64     1-D ``float64``                     ``0.0``
bool        1-D ``bool``                        ``False``
string      1-D ``object`` of ``str``           ``None``
bytes       1-D ``object`` of ``bytes``         ``None``
vector      2-D ``float32`` (rows x dim)        a row of ``0.0``
==========  ==================================  ===============================

Nulls are carried by a separate boolean mask (``True`` = null), present only for columns that
have at least one null. NaN is a float value, never a null.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, TypeAlias, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from wire.errors import (
    ColumnTypeMismatch,
    InvalidColumnName,
    InvalidValue,
    MissingColumn,
    NullNotAllowed,
    UnsupportedColumnType,
)

MAX_VECTOR_DIM: Final = 1 << 20
MAX_COLUMN_NAME_LEN: Final = 256
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

#: What :func:`wire.chunks.encode_chunk` accepts for one column: a numpy array (masked arrays
#: mark nulls), a pyarrow Array/ChunkedArray, or a sequence of Python values (``None`` = null).
ColumnData: TypeAlias = "NDArray[Any] | Sequence[Any] | pa.Array | pa.ChunkedArray"


class Kind(StrEnum):
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"
    STRING = "string"
    BYTES = "bytes"
    VECTOR = "vector"  # fixed-size vector of float32, ``dim`` elements


_NUMPY_DTYPES: Final[Mapping[Kind, np.dtype[Any]]] = MappingProxyType(
    {
        Kind.INT64: np.dtype(np.int64),
        Kind.FLOAT32: np.dtype(np.float32),
        Kind.FLOAT64: np.dtype(np.float64),
        Kind.BOOL: np.dtype(np.bool_),
        Kind.STRING: np.dtype(object),
        Kind.BYTES: np.dtype(object),
        Kind.VECTOR: np.dtype(np.float32),
    }
)

_TYPE_RE: Final = re.compile(r"\s*vector\s*\[\s*float32\s*,\s*(\d+)\s*\]\s*")


@dataclass(frozen=True)
class ColumnType:
    """A column's type: ``ColumnType(Kind.INT64)``, ``ColumnType.vector(768)``..."""

    kind: Kind
    dim: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        if self.kind is Kind.VECTOR:
            if (
                not isinstance(self.dim, int)
                or isinstance(self.dim, bool)
                or not 1 <= self.dim <= MAX_VECTOR_DIM
            ):
                raise UnsupportedColumnType(
                    f"vector dim must be an integer in [1, {MAX_VECTOR_DIM}], found {self.dim!r}",
                    expected=f"1..{MAX_VECTOR_DIM}",
                    found=repr(self.dim),
                )
        elif self.dim is not None:
            raise UnsupportedColumnType(
                f"only vector columns have a dim; {self.kind.value} has dim={self.dim!r}",
                expected="dim=None",
                found=repr(self.dim),
            )

    @classmethod
    def vector(cls, dim: int) -> ColumnType:
        return cls(Kind.VECTOR, dim)

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        """Parses ``str(column_type)``: ``int64``, ``string``, ``vector[float32,768]``..."""
        match = _TYPE_RE.fullmatch(text)
        if match:
            return cls.vector(int(match[1]))
        try:
            kind = Kind(text.strip())
        except ValueError:
            kind = Kind.VECTOR  # bare "vector" without dim is not a full type
        if kind is Kind.VECTOR:
            raise UnsupportedColumnType(
                f"unknown column type {text!r}; expected one of "
                f"{', '.join(k.value for k in Kind if k is not Kind.VECTOR)}, vector[float32,DIM]",
                found=text,
            )
        return cls(kind)

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return _NUMPY_DTYPES[self.kind]

    def __str__(self) -> str:
        if self.kind is Kind.VECTOR:
            return f"vector[float32,{self.dim}]"
        return self.kind.value


INT64: Final = ColumnType(Kind.INT64)
FLOAT32: Final = ColumnType(Kind.FLOAT32)
FLOAT64: Final = ColumnType(Kind.FLOAT64)
BOOL: Final = ColumnType(Kind.BOOL)
STRING: Final = ColumnType(Kind.STRING)
BYTES: Final = ColumnType(Kind.BYTES)


@dataclass(frozen=True)
class TableSchema:
    """What a consumer expects of a table's chunks: every named column present with exactly this
    type; columns in ``non_nullable`` without nulls. Extra columns in a chunk are allowed (they
    pass through)."""

    columns: Mapping[str, ColumnType]
    non_nullable: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", MappingProxyType(dict(self.columns)))
        object.__setattr__(self, "non_nullable", frozenset(self.non_nullable))
        unknown = self.non_nullable - set(self.columns)
        if unknown:
            raise MissingColumn(
                f"non_nullable names columns the schema lacks: {sorted(unknown)}",
                column=sorted(unknown)[0],
            )

    def check(self, columns: Mapping[str, Column]) -> None:
        """Raises MissingColumn, ColumnTypeMismatch or NullNotAllowed for the first problem."""
        for name, expected in self.columns.items():
            col = columns.get(name)
            if col is None:
                raise MissingColumn(
                    f"column {name!r} ({expected}) is missing; the chunk has "
                    f"{sorted(columns) or 'no columns'}",
                    column=name,
                    expected=str(expected),
                    found="absent",
                )
            if col.type != expected:
                raise ColumnTypeMismatch(
                    f"column {name!r}: expected type {expected}, found {col.type}",
                    column=name,
                    expected=str(expected),
                    found=str(col.type),
                )
            if name in self.non_nullable and col.nulls is not None:
                row = int(np.argmax(col.nulls))
                raise NullNotAllowed(
                    f"column {name!r} is non-nullable but row {row} is null "
                    f"({int(col.nulls.sum())} null row(s) in all)",
                    column=name,
                    expected="no nulls",
                    found=f"null at row {row}",
                )


@dataclass(frozen=True, eq=False)
class Column:
    """One column in canonical form (see the module docstring). ``nulls`` is ``None`` when the
    column has no null; otherwise a bool array, ``True`` where the row is null."""

    name: str
    type: ColumnType
    values: NDArray[Any]
    nulls: NDArray[np.bool_] | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def slice(self, start: int, stop: int) -> Column:
        nulls = None if self.nulls is None else self.nulls[start:stop]
        if nulls is not None and not nulls.any():
            nulls = None
        return Column(self.name, self.type, self.values[start:stop], nulls)


def vector_type(name: str, dim: object) -> ColumnType:
    """``ColumnType.vector(dim)``, with an error naming the column when ``dim`` is out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_VECTOR_DIM:
        raise UnsupportedColumnType(
            f"column {name!r}: vector dim must be an integer in [1, {MAX_VECTOR_DIM}], "
            f"found {dim!r}",
            column=name,
            expected=f"1..{MAX_VECTOR_DIM}",
            found=repr(dim),
        )
    return ColumnType.vector(dim)


def check_column_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_COLUMN_NAME_LEN:
        raise InvalidColumnName(
            f"column name must be a non-empty string of at most {MAX_COLUMN_NAME_LEN} "
            f"characters, found {name!r}",
            column=str(name),
            expected=f"1..{MAX_COLUMN_NAME_LEN} characters",
            found=repr(name),
        )
    return name


def make_column(
    name: str, values: NDArray[Any], ctype: ColumnType, nulls: NDArray[np.bool_] | None
) -> Column:
    """Builds a canonical column: fills null rows, drops an all-false mask, and hands out
    read-only views (the caller's own arrays keep their flags)."""
    if nulls is not None:
        if nulls.any():
            values = fill_nulls(values, nulls, ctype)
            nulls = _read_only(nulls)
        else:
            nulls = None
    return Column(name, ctype, _read_only(values), nulls)


def _read_only(arr: NDArray[Any]) -> NDArray[Any]:
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def fill_nulls(values: NDArray[Any], nulls: NDArray[np.bool_], ctype: ColumnType) -> NDArray[Any]:
    """A copy of ``values`` with null rows set to the documented fill value, unless they
    already hold it."""
    fill: object = None if ctype.kind in (Kind.STRING, Kind.BYTES) else 0
    sub = values[nulls]
    if fill is None:
        if all(v is None for v in sub):
            return values
    elif not sub.any() and not (sub.dtype.kind == "f" and np.signbit(sub).any()):
        return values  # already all zero (and no -0.0)
    out = values.copy()
    out[nulls] = fill
    return out


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


def checked_float32(name: str, wide: NDArray[Any]) -> NDArray[np.float32]:
    """Casts to float32, refusing finite values that would overflow to infinity."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = wide.astype(np.float32)
    if wide.dtype.kind == "f" and wide.dtype.itemsize > 4:
        finite = np.isfinite(out)
        if not finite.all():
            bad = ~finite & np.isfinite(wide)
            if bad.any():
                idx = np.argwhere(bad)[0]
                row = int(idx[0])
                raise InvalidValue(
                    f"column {name!r}: value {wide[tuple(idx)]!r} at row {row} is out of "
                    "float32 range",
                    column=name,
                    expected="|x| <= 3.4028235e38",
                    found=repr(wide[tuple(idx)]),
                )
    return out


# --- caller data -> canonical ------------------------------------------------------------------

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
        mask = row_mask
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


# --- Arrow <-> canonical ----------------------------------------------------------------------

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
            return Column(name, ctype, _read_only(arr.to_numpy(zero_copy_only=False)))

        return numeric
    if ctype.kind is Kind.VECTOR and pa.types.is_fixed_size_list(atype):
        dim = cast("int", ctype.dim)

        def vector(name: str, arr: pa.Array) -> Column:
            n = len(arr)
            flat = arr.values.slice(arr.offset * dim, n * dim)
            if arr.null_count or flat.null_count:
                return general(name, arr)
            values = flat.to_numpy(zero_copy_only=False).reshape(n, dim)
            return Column(name, ctype, _read_only(values))

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
            row = next(i for i, v in enumerate(col.values) if _unencodable(v))
            raise InvalidValue(
                f"column {col.name!r}: row {row} is not encodable as UTF-8 ({exc.reason})",
                column=col.name,
                expected="valid Unicode text",
                found=repr(col.values[row])[:80],
            ) from exc
    return pa.array(col.values, type=atype, mask=col.nulls)


def _unencodable(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT32",
    "FLOAT64",
    "INT64",
    "Column",
    "ColumnData",
    "ColumnType",
    "Kind",
    "TableSchema",
    "arrow_to_column",
    "arrow_type_of",
    "column_to_arrow",
    "column_type_of_arrow",
    "to_column",
]
