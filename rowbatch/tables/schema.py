"""The ``--schema`` option: ``id:int64,text:string,features:vector[float32,16]`` read as column
types."""

from __future__ import annotations

import re
from typing import Final

from rowbatch.tables.errors import InputError
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import UnsupportedColumnType

_SCHEMA_ENTRY: Final = re.compile(r"\s*([^:,]+?)\s*:\s*(vector\s*\[[^\]]*\]|[^,]+?)\s*(?:,|$)")


def parse_schema(text: str) -> dict[str, ColumnType]:
    """``name:type,...`` -> column types; types as in docs/wire-format.md section 4
    (``int64``, ``float32``, ``float64``, ``bool``, ``string``, ``bytes``,
    ``vector[float32,D]``)."""
    out: dict[str, ColumnType] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _SCHEMA_ENTRY.match(text, pos)
        if match is None or match.end() == pos:
            raise InputError(
                f"--schema: cannot read {text[pos:]!r}; expected name:type[,name:type...], "
                "e.g. id:int64,text:string,features:vector[float32,16]"
            )
        name, type_text = match[1], match[2]
        try:
            ctype = ColumnType.parse(type_text)
        except UnsupportedColumnType as exc:
            raise InputError(f"--schema: column {name!r}: {exc}") from None
        if name in out:
            raise InputError(f"--schema: column {name!r} is given twice")
        out[name] = ctype
        pos = match.end()
    if not out:
        raise InputError("--schema is empty")
    return out


__all__ = ["parse_schema"]
