"""Reading CSV: the first line is the header; empty cells and ``null``/``NULL`` are nulls in
non-string columns (a string column keeps ``""``); ``NaN``/``inf`` are float values; a vector
cell is a JSON array (``"[0.1, 0.2]"``), read as text here and parsed on conversion."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import pyarrow as pa
import pyarrow.csv as pcsv

from rowbatch.wire.columns.arrow import arrow_type_of
from rowbatch.wire.columns.column_type import ColumnType, Kind

_CSV_NULLS: Final = ["", "null", "NULL"]
# Quoted values may span lines (text columns); Arrow then splits blocks more carefully.
_CSV_PARSE: Final = pcsv.ParseOptions(newlines_in_values=True)


def _csv_types(schema: Mapping[str, ColumnType]) -> dict[str, pa.DataType]:
    return {
        name: pa.string() if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        for name, ctype in schema.items()
    }


def csv_batches(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    """Record batches of the CSV in ``stream``, parsed ``block_bytes`` at a time; columns in
    ``schema`` are read as its types."""
    return pcsv.open_csv(  # type: ignore[no-any-return]
        stream,
        read_options=pcsv.ReadOptions(block_size=block_bytes),
        parse_options=_CSV_PARSE,
        convert_options=pcsv.ConvertOptions(
            column_types=_csv_types(schema), null_values=_CSV_NULLS
        ),
    )


__all__ = ["csv_batches"]
