"""The Iceberg table of a ``TableSpec``: its Arrow form (created from it), the day partition of
``processed_at``, the check of an existing table, and result rows cast to the table's file
schema."""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform

from rowbatch.consumer.sinks.base import ResultRows, TableMismatch, TableSpec
from rowbatch.consumer.sinks.parquet.rows import arrow_schema as parquet_schema
from rowbatch.consumer.sinks.parquet.rows import to_arrow

PARTITION_NAME: Final = "processed_at_day"

#: Arrow types Iceberg has no equal of, and what they are stored as (wide enough for every value).
_WIDER: Final = {
    pa.int8(): pa.int32(),
    pa.int16(): pa.int32(),
    pa.uint8(): pa.int32(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
}


def _iceberg_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        element = kind.value_field
        return pa.list_(pa.field("element", _iceberg_type(element.type), nullable=False))
    return _WIDER.get(kind, kind)


def arrow_schema(table: TableSpec) -> pa.Schema:
    """The table's columns as Arrow types Iceberg stores (vectors as lists, small and unsigned
    integers widened), from which the table is created."""
    base = parquet_schema(table)
    return pa.schema([pa.field(f.name, _iceberg_type(f.type), f.nullable) for f in base])


def partition_spec(schema: Schema) -> PartitionSpec:
    """Partitioned by the UTC day of ``processed_at``."""
    source = schema.find_field("processed_at").field_id
    return PartitionSpec(
        PartitionField(
            source_id=source, field_id=1000, transform=DayTransform(), name=PARTITION_NAME
        )
    )


def _type_name(kind: pa.DataType) -> str:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_name(kind.value_type)}>"
    if pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_large_binary(kind):
        return "binary"
    return str(kind)


def check(where: str, existing: Schema, wanted: pa.Schema) -> None:
    """Raises :class:`TableMismatch` naming the first column of ``wanted`` that the existing
    table lacks or holds with another type (extra columns in the table are allowed: they
    stay null in the rows written here)."""
    have = {f.name: _type_name(f.type) for f in schema_to_pyarrow(existing)}
    for f in wanted:
        kind = _type_name(f.type)
        if f.name not in have:
            raise TableMismatch(f"{where} lacks column {f.name!r} ({kind})", column=f.name)
        if have[f.name] != kind:
            raise TableMismatch(
                f"{where}: column {f.name!r} is {have[f.name]}, expected {kind}", column=f.name
            )


def file_rows(table: TableSpec, file_schema: pa.Schema, rows: ResultRows) -> pa.Table:
    """``rows`` as a table of the data files' schema (the table's, with its field ids); a
    value that cannot be stored raises ``RowsRejected`` naming the column."""
    plain = to_arrow(table, parquet_schema(table), rows)
    columns = [
        plain.column(f.name).cast(f.type)
        if f.name in plain.column_names
        else pa.nulls(len(rows), f.type)
        for f in file_schema
    ]
    return pa.Table.from_arrays(columns, schema=file_schema)
