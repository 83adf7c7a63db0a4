"""The JSON encoding (``application/json``) of a chunk: column-major, typed.

    {"columns": [
        {"name": "id",        "type": "int64",  "values": [1, 2, null]},
        {"name": "text",      "type": "string", "values": ["a", "", null]},
        {"name": "embedding", "type": "vector", "dim": 3,
         "values": [[0.1, 0.2, 0.3], null, [1, 2, 3]]}
    ]}

See ``docs/wire-format.md`` for the full rules. Decoding checks every value's JSON type against
the declared column type (a float in an int64 column, a bool in a float column, a string in a
vector are errors, never silent conversions).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

import numpy as np
import orjson
from numpy.typing import NDArray

from wire.columns import (
    Column,
    ColumnType,
    Kind,
    checked_float32,
    make_column,
    vector_type,
)
from wire.errors import (
    ColumnTypeMismatch,
    InvalidColumnName,
    InvalidJson,
    InvalidValue,
    UnsupportedColumnType,
)

_ESCAPED_SURROGATE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_COLON: Final = re.compile(rb"\\u003[aA]")
_ENTRY_KEYS: Final = frozenset({"name", "type", "dim", "values"})
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
#: Column types by JSON type name, for the names that need no ``dim``.
_SCALAR_TYPES: Final[Mapping[str, ColumnType]] = {
    kind.value: ColumnType(kind) for kind in Kind if kind is not Kind.VECTOR
}
#: Vector types by dim, made once (``vector_type`` checks the dim).
_VECTOR_TYPES: Final[dict[int, ColumnType]] = {}
_MAX_VECTOR_TYPES: Final = 1024


# --- encode -----------------------------------------------------------------------------------


def _float_list(values: NDArray[Any]) -> list[Any]:
    """Python floats (nested for 2-D) with shortest round-trip text; non-finite as strings."""
    if values.dtype == np.float32:
        # float32 -> shortest decimal -> float64: its repr is the short text ("0.1", not
        # "0.10000000149011612"). A reader parses it as float64 and narrows it to float32; where
        # that double rounding would not give the same float32 back, keep the exact value.
        with np.errstate(all="ignore"):
            short = values.astype(str).astype(np.float64)
            exact = short.astype(np.float32) == values
        exact |= np.isnan(values)
        if not exact.all():
            short[~exact] = values[~exact]
        values = short
    out = cast("list[Any]", values.tolist())
    if not np.isfinite(values).all():
        if values.ndim == 1:
            out = [x if math.isfinite(x) else _nonfinite_text(x) for x in out]
        else:
            for i in np.flatnonzero(~np.isfinite(values).all(axis=1)).tolist():
                out[i] = [x if math.isfinite(x) else _nonfinite_text(x) for x in out[i]]
    return out


def _nonfinite_text(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def _json_values(col: Column) -> list[Any]:
    kind = col.type.kind
    values: list[Any]
    if kind in (Kind.FLOAT32, Kind.FLOAT64, Kind.VECTOR):
        values = _float_list(col.values)
    elif kind is Kind.BYTES:
        values = [None if v is None else base64.b64encode(v).decode("ascii") for v in col.values]
    else:
        values = cast("list[Any]", col.values.tolist())
    if col.nulls is not None and kind not in (Kind.STRING, Kind.BYTES):
        for i in np.flatnonzero(col.nulls).tolist():
            values[i] = None
    return values


def encode_json(columns: Sequence[Column]) -> bytes:
    entries: list[dict[str, Any]] = []
    for col in columns:
        entry: dict[str, Any] = {"name": col.name, "type": col.type.kind.value}
        if col.type.kind is Kind.VECTOR:
            entry["dim"] = col.type.dim
        entry["values"] = _json_values(col)
        entries.append(entry)
    text = json.dumps(
        {"columns": entries}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _unencodable(columns, exc) from exc


def _unencodable(columns: Sequence[Column], exc: UnicodeEncodeError) -> InvalidValue:
    for col in columns:
        bad_name = _has_surrogate(col.name)
        if bad_name or col.type.kind is Kind.STRING:
            rows = [] if bad_name else [i for i, v in enumerate(col.values) if _has_surrogate(v)]
            if bad_name or rows:
                where = "its name" if bad_name else f"row {rows[0]}"
                return InvalidValue(
                    f"column {col.name!r}: {where} is not encodable as UTF-8 ({exc.reason})",
                    column=col.name,
                    expected="valid Unicode text",
                    found=where,
                )
    return InvalidValue(f"chunk is not encodable as UTF-8: {exc}")


def _has_surrogate(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# --- decode -----------------------------------------------------------------------------------


def decode_json(payload: bytes | bytearray | memoryview) -> list[Column]:
    """The payload's columns; raises a :class:`~wire.errors.WireError` subclass.

    orjson parses first; where its result might differ from the stdlib parser's (anything it
    rejects, such as NaN literals or a BOM, and duplicate members) or the payload is bad, the
    stdlib path decodes it again, so results and error messages are those of
    :func:`json.loads`."""
    data = payload if isinstance(payload, bytes) else bytes(payload)
    columns = _decode_fast(data)
    return columns if columns is not None else _decode_strict(data)


def _decode_fast(data: bytes) -> list[Column] | None:
    """The columns, when orjson's parse is certainly what the stdlib gives; else None.

    orjson reads integer literals beyond 64 bits as floats (the stdlib: as ints). Only float
    and vector columns accept such a float, and they convert the int to the same float64."""
    if b"\\" in data and _ESCAPED_COLON.search(data):
        return None  # an escaped colon would upset the duplicate-member count below
    try:
        doc = orjson.loads(data)
        columns = _columns(doc)
    except Exception:  # noqa: BLE001 - any trouble: the strict path decodes it and says why
        return None
    # orjson keeps the last of duplicate members silently; the stdlib path rejects them. Every
    # colon outside a string ends a member name, so the payload has as many colons as the
    # members parsed plus the colons inside strings (no escaped colons, checked above).
    expected = 1 + sum(map(len, doc["columns"]))  # member names; then colons in strings
    for col in columns:
        expected += col.name.count(":")
        if col.type.kind is Kind.STRING:
            expected += "".join(filter(None, col.values.tolist())).count(":")
    return columns if data.count(b":") == expected else None


def _decode_strict(data: bytes) -> list[Column]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJson(
            f"payload is not UTF-8 text: {exc}", expected="UTF-8 JSON", found="invalid UTF-8"
        ) from exc
    try:
        doc = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_object)
    except (ValueError, RecursionError) as exc:
        raise InvalidJson(
            f"payload is not valid JSON: {exc}", expected="a JSON object", found=str(exc)
        ) from exc
    columns = _columns(doc)
    if _ESCAPED_SURROGATE.search(text):
        _check_unicode(columns)
    return columns


def _columns(doc: object) -> list[Column]:
    if not isinstance(doc, dict) or set(doc) != {"columns"}:
        found = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise InvalidJson(
            f"expected a JSON object with exactly the member 'columns', found {found}",
            expected='{"columns": [...]}',
            found=str(found),
        )
    entries = doc["columns"]
    if not isinstance(entries, list):
        raise InvalidJson(
            f"'columns' must be an array of column objects, found {type(entries).__name__}",
            expected="array",
            found=type(entries).__name__,
        )
    return [_decode_entry(i, entry) for i, entry in enumerate(entries)]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate member {key!r} in a JSON object")
            seen.add(key)
    return obj


def _check_unicode(columns: Sequence[Column]) -> None:
    """JSON escapes can spell lone UTF-16 surrogates (``"\\ud800"``), which are not text."""
    for col in columns:
        if _has_surrogate(col.name):
            raise InvalidColumnName(
                f"column name {col.name!r} is not valid Unicode (lone surrogate)",
                column=col.name,
                expected="valid Unicode",
                found="lone surrogate",
            )
        if col.type.kind is Kind.STRING:
            for row, value in enumerate(col.values):
                if _has_surrogate(value):
                    raise InvalidValue(
                        f"column {col.name!r}: row {row} is not valid Unicode (lone surrogate "
                        f"escape) {value!r:.80}",
                        column=col.name,
                        expected="valid Unicode text",
                        found="lone surrogate",
                    )


def _decode_entry(index: int, entry: object) -> Column:
    where = f"columns[{index}]"
    if not isinstance(entry, dict):
        raise InvalidJson(
            f"{where} must be an object, found {type(entry).__name__}",
            expected="object",
            found=type(entry).__name__,
        )
    name = entry.get("name")
    members = len(entry)
    if (
        type(name) is str
        and (members == 3 or (members == 4 and "dim" in entry))
        and "type" in entry
        and "values" in entry
    ):  # exactly name, type, values and perhaps dim
        ctype = _entry_type_fast(name, entry)
        values = entry["values"]
        if ctype is not None and type(values) is list:
            converted, nulls = _convert(name, ctype, values)
            return make_column(name, converted, ctype, nulls)
    if isinstance(name, str):
        where = f"column {name!r}"
    unknown = set(entry) - _ENTRY_KEYS
    missing = {"name", "type", "values"} - set(entry)
    if unknown or missing:
        raise InvalidJson(
            f"{where}: unknown member(s) {sorted(unknown)}, missing member(s) {sorted(missing)}; "
            "a column object has name, type, values and (vectors only) dim",
            column=name if isinstance(name, str) else None,
            expected="name, type, values[, dim]",
            found=", ".join(sorted(entry)),
        )
    if not isinstance(name, str):
        raise InvalidJson(
            f"{where}: 'name' must be a string, found {type(name).__name__}",
            expected="string",
            found=type(name).__name__,
        )
    ctype = _entry_type(name, entry)
    values = entry["values"]
    if not isinstance(values, list):
        raise InvalidJson(
            f"{where}: 'values' must be an array, found {type(values).__name__}",
            column=name,
            expected="array",
            found=type(values).__name__,
        )
    converted, nulls = _convert(name, ctype, values)
    return make_column(name, converted, ctype, nulls)


def _entry_type_fast(name: str, entry: Mapping[str, Any]) -> ColumnType | None:
    """The column type of a well-formed entry (what :func:`_entry_type` returns); None where
    :func:`_entry_type` should decide (and word any error)."""
    type_name = entry["type"]
    if type(type_name) is not str:
        return None
    if "dim" not in entry:
        return _SCALAR_TYPES.get(type_name)
    dim = entry["dim"]
    if type_name != "vector" or type(dim) is not int:
        return None
    ctype = _VECTOR_TYPES.get(dim)
    if ctype is None:
        ctype = _entry_type(name, entry)  # checks the dim
        if len(_VECTOR_TYPES) < _MAX_VECTOR_TYPES:
            _VECTOR_TYPES[dim] = ctype
    return ctype


def _entry_type(name: str, entry: Mapping[str, Any]) -> ColumnType:
    type_name, dim = entry["type"], entry.get("dim")
    try:
        kind = Kind(type_name)
    except ValueError:
        kind = None
    if kind is None or not isinstance(type_name, str):
        raise UnsupportedColumnType(
            f"column {name!r}: unknown type {type_name!r}; expected one of "
            f"{', '.join(k.value for k in Kind)}",
            column=name,
            expected=", ".join(k.value for k in Kind),
            found=repr(type_name),
        )
    if kind is Kind.VECTOR:
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise InvalidJson(
                f"column {name!r}: a vector column needs an integer 'dim', found {dim!r}",
                column=name,
                expected="integer dim",
                found=repr(dim),
            )
        return vector_type(name, dim)
    if "dim" in entry:
        raise InvalidJson(
            f"column {name!r}: 'dim' is only for vector columns, not {kind.value}",
            column=name,
            expected="no dim",
            found=repr(dim),
        )
    return ColumnType(kind)


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


def _convert(
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
