"""One JSON column's ``values`` -> its canonical numpy array and null mask
(:func:`convert_values`), checking every value's JSON type against the column type: a float in
an int64 column, a bool in a float column, a string in a vector are errors, never silent
conversions."""

from __future__ import annotations

import base64
import binascii
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.columns.canonical import checked_float32
from rowbatch.wire.columns.column_type import ColumnType, Kind
from rowbatch.wire.errors import ColumnTypeMismatch, InvalidValue

_NON_FINITE: Final[Mapping[str, float]] = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
}

_NONE: Final[type] = type(None)
_INT: Final[frozenset[type]] = frozenset({int})
_INT_NULL: Final[frozenset[type]] = frozenset({int, _NONE})
_FLOAT: Final[frozenset[type]] = frozenset({int, float})
_FLOAT_NULL: Final[frozenset[type]] = frozenset({int, float, _NONE})
_BOOL: Final[frozenset[type]] = frozenset({bool})
_BOOL_NULL: Final[frozenset[type]] = frozenset({bool, _NONE})
_STR_NULL: Final[frozenset[type]] = frozenset({str, _NONE})
_ROW_NULL: Final[frozenset[type]] = frozenset({list, _NONE})
_FLOAT_OR_STR: Final[frozenset[type]] = frozenset({int, float, str})
_FLOAT32_MAX: Final = float(np.finfo(np.float32).max)
_SHORT_FLOATS: Final = 32


def _mismatch(
    name: str, ctype: ColumnType, values: Sequence[Any], ok: frozenset[type]
) -> ColumnTypeMismatch:
    for i, v in enumerate(values):
        if type(v) not in ok:
            return ColumnTypeMismatch(
                f"column {name!r} ({ctype}): row {i} holds JSON {_json_type(v)} {v!r:.80}",
                column=name,
                expected=str(ctype),
                found=_json_type(v),
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _json_type(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        _NONE: "null",
    }.get(type(value), type(value).__name__)


def _null_mask(values: list[Any]) -> NDArray[np.bool_]:
    return np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values))


def convert_values(
    name: str, ctype: ColumnType, values: list[Any]
) -> tuple[NDArray[Any], NDArray[np.bool_] | None]:
    kind = ctype.kind
    types = set(map(type, values))
    nulls = _null_mask(values) if _NONE in types else None
    if kind in (Kind.STRING, Kind.BYTES):
        if not types <= _STR_NULL:
            raise _mismatch(name, ctype, values, _STR_NULL)
        out = np.empty(len(values), dtype=object)
        out[:] = values if kind is Kind.STRING else [_b64(name, i, v) for i, v in enumerate(values)]
        return out, nulls
    if kind is Kind.VECTOR:
        return _convert_vectors(name, ctype, values, types, nulls)
    if nulls is not None:
        fill: object = False if kind is Kind.BOOL else 0
        values = [fill if v is None else v for v in values]
        types.discard(_NONE)
    if kind is Kind.BOOL:
        if not types <= _BOOL:
            raise _mismatch(name, ctype, values, _BOOL_NULL)
        return np.array(values, dtype=np.bool_).reshape(len(values)), nulls
    if kind is Kind.INT64:
        if not types <= _INT:
            raise _mismatch(name, ctype, values, _INT_NULL)
        try:
            return np.array(values, dtype=np.int64).reshape(len(values)), nulls
        except OverflowError:
            row = next(i for i, v in enumerate(values) if not -(2**63) <= v < 2**63)
            raise InvalidValue(
                f"column {name!r}: value {values[row]} at row {row} is out of int64 range",
                column=name,
                expected="int64",
                found=str(values[row]),
            ) from None
    # float32 / float64
    if not types <= _FLOAT:
        if not types <= _FLOAT_OR_STR:
            raise _mismatch(name, ctype, values, _FLOAT_NULL)
        values = [_nonfinite(name, i, v) if type(v) is str else v for i, v in enumerate(values)]
    return _floats(name, kind, values, (len(values),)), nulls


def _float32_fast(values: list[Any], shape: tuple[int, ...]) -> NDArray[np.float32] | None:
    """``values`` (ints and floats) as float32 when every one is within float32's finite range,
    so the cast cannot overflow; None otherwise (NaN, infinities, anything beyond: the checked
    cast decides). Short lists are checked in Python, long ones in numpy (as float64, which
    rounds to the same float32)."""
    if len(values) <= _SHORT_FLOATS:
        if values and not (min(values) >= -_FLOAT32_MAX and max(values) <= _FLOAT32_MAX):
            return None
        return np.array(values, dtype=np.float32).reshape(shape)
    try:
        wide = np.array(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64: the checked path says so
        return None
    if not (wide.min() >= -_FLOAT32_MAX and wide.max() <= _FLOAT32_MAX):
        return None
    return wide.astype(np.float32).reshape(shape)


def _floats(name: str, kind: Kind, values: list[Any], shape: tuple[int, ...]) -> NDArray[Any]:
    """``values`` (flat: ints and floats) as float64 or float32 of ``shape``."""
    if kind is Kind.FLOAT32:
        fast = _float32_fast(values, shape)
        if fast is not None:
            return fast
    try:
        if kind is Kind.FLOAT64:
            return np.array(values, dtype=np.float64).reshape(shape)
        with np.errstate(over="ignore"):
            narrow = np.array(values, dtype=np.float32).reshape(shape)
        if np.isinf(narrow).any():  # a JSON Infinity, or a finite value too big for float32?
            narrow = checked_float32(name, np.array(values, dtype=np.float64).reshape(shape))
    except OverflowError as exc:  # an integer literal beyond float64
        raise InvalidValue(
            f"column {name!r}: a number is out of range: {exc}", column=name, found="huge number"
        ) from exc
    return narrow


def _nonfinite(name: str, row: int, value: str) -> float:
    try:
        return _NON_FINITE[value]
    except KeyError:
        raise ColumnTypeMismatch(
            f"column {name!r}: row {row} holds the string {value!r:.80}; a float or vector "
            'column takes numbers, null and the strings "NaN", "Infinity", "-Infinity"',
            column=name,
            expected='number, null, "NaN", "Infinity" or "-Infinity"',
            found=f"string {value!r:.80}",
        ) from None


def _b64(name: str, row: int, value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidValue(
            f"column {name!r}: row {row} is not valid standard base64 ({exc})",
            column=name,
            expected="standard base64 with padding",
            found=repr(value)[:80],
        ) from exc


def _convert_vectors(
    name: str,
    ctype: ColumnType,
    rows: list[Any],
    types: set[type],
    nulls: NDArray[np.bool_] | None,
) -> tuple[NDArray[Any], NDArray[np.bool_] | None]:
    dim = cast("int", ctype.dim)
    n = len(rows)
    if not types <= _ROW_NULL:
        raise _mismatch(name, ctype, rows, _ROW_NULL)
    if nulls is not None:
        zero = [0.0] * dim
        rows = [zero if r is None else r for r in rows]
    lengths = set(map(len, rows))
    if lengths - {dim}:
        row = next(i for i, r in enumerate(rows) if len(r) != dim)
        raise ColumnTypeMismatch(
            f"column {name!r} ({ctype}): row {row} has {len(rows[row])} elements, expected {dim}",
            column=name,
            expected=f"{dim} elements",
            found=f"{len(rows[row])} elements",
        )
    flat = list(itertools.chain.from_iterable(rows))
    elem_types = set(map(type, flat))
    if elem_types <= _FLOAT:
        return _floats(name, Kind.FLOAT32, flat, (n, dim)), nulls
    if _NONE in elem_types:
        row = next(i for i, r in enumerate(rows) if None in r)
        raise InvalidValue(
            f"column {name!r} ({ctype}): row {row} has a null element; a vector row is null as "
            "a whole or not at all",
            column=name,
            expected="no null elements",
            found=f"null element in row {row}",
        )
    if not elem_types <= _FLOAT:
        if not elem_types <= _FLOAT_OR_STR:
            for i, r in enumerate(rows):
                if not set(map(type, r)) <= _FLOAT_OR_STR:
                    bad = next(v for v in r if type(v) not in _FLOAT_OR_STR)
                    raise ColumnTypeMismatch(
                        f"column {name!r} ({ctype}): row {i} holds a JSON {_json_type(bad)} "
                        f"{bad!r:.80} where a number belongs",
                        column=name,
                        expected="numbers",
                        found=_json_type(bad),
                    )
        flat = [
            _nonfinite(name, i, v) if type(v) is str else v for i, r in enumerate(rows) for v in r
        ]
    return _floats(name, Kind.FLOAT32, flat, (n, dim)), nulls
