"""The JSON payload -> canonical columns (:func:`decode_json`): the document's shape and each
column object's members and type (:mod:`rowbatch.wire.codec_json.values` converts the values).
orjson parses where its result is certainly the stdlib parser's; the stdlib parser does the rest."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from rowbatch.wire.codec_json.values import convert_values
from rowbatch.wire.columns.canonical import Column, has_surrogate, make_column
from rowbatch.wire.columns.column_type import ColumnType, Kind, vector_type
from rowbatch.wire.errors import InvalidColumnName, InvalidJson, InvalidValue, UnsupportedColumnType

_ESCAPED_SURROGATE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_COLON: Final = re.compile(rb"\\u003[aA]")
_ENTRY_KEYS: Final = frozenset({"name", "type", "dim", "values"})

#: Column types by JSON type name, for the names that need no ``dim``.
_SCALAR_TYPES: Final[Mapping[str, ColumnType]] = {
    kind.value: ColumnType(kind) for kind in Kind if kind is not Kind.VECTOR
}
#: Vector types by dim, made once (``vector_type`` checks the dim).
_VECTOR_TYPES: Final[dict[int, ColumnType]] = {}
_MAX_VECTOR_TYPES: Final = 1024


def decode_json(payload: bytes | bytearray | memoryview) -> list[Column]:
    """The payload's columns; raises a :class:`~rowbatch.wire.errors.WireError` subclass.

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
        if has_surrogate(col.name):
            raise InvalidColumnName(
                f"column name {col.name!r} is not valid Unicode (lone surrogate)",
                column=col.name,
                expected="valid Unicode",
                found="lone surrogate",
            )
        if col.type.kind is Kind.STRING:
            for row, value in enumerate(col.values):
                if has_surrogate(value):
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
            converted, nulls = convert_values(name, ctype, values)
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
    converted, nulls = convert_values(name, ctype, values)
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
