"""Column types of the wire contract and the conversions between caller data, the canonical
numpy form that :func:`rowbatch.wire.chunks.decode_chunk` returns, and Arrow arrays.

- :mod:`~rowbatch.wire.columns.column_type`: :class:`Kind`, :class:`ColumnType` and the scalar types
- :mod:`~rowbatch.wire.columns.canonical`: :class:`Column`, the canonical numpy form, value checks
- :mod:`~rowbatch.wire.columns.schema`: :class:`TableSchema` and the checks on a chunk's columns
- :mod:`~rowbatch.wire.columns.caller_data`: :func:`to_column`, caller data -> canonical
- :mod:`~rowbatch.wire.columns.arrow`: Arrow types and arrays <-> column types and canonical columns
"""

from rowbatch.wire.columns.arrow import (
    ArrowConverter,
    arrow_converter,
    arrow_to_column,
    arrow_to_column_of_type,
    arrow_type_of,
    column_to_arrow,
    column_type_of_arrow,
)
from rowbatch.wire.columns.caller_data import ColumnData, to_column
from rowbatch.wire.columns.canonical import (
    MAX_COLUMN_NAME_LEN,
    Column,
    check_column_name,
    checked_float32,
    fill_nulls,
    make_column,
)
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    INT64_MAX,
    INT64_MIN,
    MAX_VECTOR_DIM,
    STRING,
    ColumnType,
    Kind,
    vector_type,
)
from rowbatch.wire.columns.schema import TableSchema

__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT32",
    "FLOAT64",
    "INT64",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_COLUMN_NAME_LEN",
    "MAX_VECTOR_DIM",
    "STRING",
    "ArrowConverter",
    "Column",
    "ColumnData",
    "ColumnType",
    "Kind",
    "TableSchema",
    "arrow_converter",
    "arrow_to_column",
    "arrow_to_column_of_type",
    "arrow_type_of",
    "check_column_name",
    "checked_float32",
    "column_to_arrow",
    "column_type_of_arrow",
    "fill_nulls",
    "make_column",
    "to_column",
    "vector_type",
]
