"""Reading JSON Lines: one object per line; arrays of numbers are vectors; a bytes column holds
the text's UTF-8 bytes (JSON has no bytes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.json as pjson

from rowbatch.wire.columns.arrow import arrow_type_of
from rowbatch.wire.columns.column_type import ColumnType, Kind


def _json_schema(schema: Mapping[str, ColumnType]) -> pa.Schema:
    fields = []
    for name, ctype in schema.items():
        atype = pa.list_(pa.float32()) if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        if ctype.kind is Kind.BYTES:
            atype = pa.string()  # JSON has no bytes: the text's UTF-8 bytes
        fields.append(pa.field(name, atype))
    return pa.schema(fields)


def jsonl_batches(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    """Record batches of the JSON Lines in ``stream``, parsed ``block_bytes`` at a time (a line
    must fit in one block); columns in ``schema`` are read as its types."""
    parse = pjson.ParseOptions(
        explicit_schema=_json_schema(schema) if schema else None,
        unexpected_field_behavior="infer",
    )
    return pjson.open_json(  # type: ignore[no-any-return]
        stream, read_options=pjson.ReadOptions(block_size=block_bytes), parse_options=parse
    )


__all__ = ["jsonl_batches"]
