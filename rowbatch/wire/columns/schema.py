"""What a chunk's columns must satisfy together: at least one, unique names and equal lengths
(:func:`check_columns`), and, where a consumer says what it expects of a table, a
:class:`TableSchema` (every named column present with its type, some of them without nulls)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import (
    ColumnLengthMismatch,
    ColumnTypeMismatch,
    DuplicateColumn,
    MissingColumn,
    NoColumns,
    NullNotAllowed,
)


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


def as_table_schema(schema: TableSchema | Mapping[str, ColumnType] | None) -> TableSchema | None:
    """``schema`` as a :class:`TableSchema` (a plain mapping: every column nullable)."""
    if schema is None or isinstance(schema, TableSchema):
        return schema
    return TableSchema(schema)


def check_columns(cols: Sequence[Column]) -> int:
    """Checks there is a column, names are unique and lengths equal; returns the row count."""
    if not cols:
        raise NoColumns(
            "a chunk needs at least one column", expected=">= 1 column", found="0 columns"
        )
    seen: set[str] = set()
    for col in cols:
        if col.name in seen:
            raise DuplicateColumn(
                f"column {col.name!r} appears more than once", column=col.name, found="duplicate"
            )
        seen.add(col.name)
    n = len(cols[0])
    for col in cols[1:]:
        if len(col) != n:
            raise ColumnLengthMismatch(
                f"column {col.name!r} has {len(col)} rows but column {cols[0].name!r} has {n}",
                column=col.name,
                expected=f"{n} rows",
                found=f"{len(col)} rows",
            )
    return n
