"""One message's payload and attributes -> a validated :class:`DecodedChunk` of read-only,
canonical numpy columns (:func:`decode_chunk`), or the :class:`~rowbatch.wire.errors.WireError` that
says how it breaks the contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.codec_arrow import Layout, decode_arrow_laid_out, read_checked
from rowbatch.wire.codec_json.decode import decode_json
from rowbatch.wire.columns.canonical import MAX_COLUMN_NAME_LEN, Column, check_column_name
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.columns.schema import TableSchema, as_table_schema, check_columns
from rowbatch.wire.errors import DuplicateColumn, RowCountMismatch
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import H_ROW_COUNT, Encoding


@dataclass(frozen=True, eq=False)
class DecodedChunk:
    """A decoded chunk. ``columns`` keeps the payload's column order; arrays are read-only and
    in the canonical form of their type (see ``rowbatch.wire.columns``). ``null_masks`` has an entry
    (bool array, ``True`` = null) only for columns with at least one null."""

    headers: ChunkHeaders
    columns: Mapping[str, NDArray[Any]]
    types: Mapping[str, ColumnType]
    null_masks: Mapping[str, NDArray[np.bool_]]
    row_count: int
    shared_types: bool = False
    """``types`` is shared with the other chunks of one Arrow layout (read by
    :class:`~rowbatch.wire.codec_arrow.Layout`): they all have the same columns, with the
    same dtypes and row shapes."""

    @property
    def chunk_id(self) -> str:
        return self.headers.chunk_id

    @property
    def table(self) -> str:
        return self.headers.table

    def column(self, name: str) -> Column:
        return Column(name, self.types[name], self.columns[name], self.null_masks.get(name))

    @classmethod
    def _of(
        cls,
        *,
        headers: ChunkHeaders,
        columns: Mapping[str, NDArray[Any]],
        types: Mapping[str, ColumnType],
        null_masks: Mapping[str, NDArray[np.bool_]],
        row_count: int,
        shared_types: bool = False,
    ) -> DecodedChunk:
        """The instance, without the frozen dataclass's per-field ``__init__`` (a cost per
        message)."""
        chunk = object.__new__(cls)
        chunk.__dict__.update(
            headers=headers,
            columns=columns,
            types=types,
            null_masks=null_masks,
            row_count=row_count,
            shared_types=shared_types,
        )
        return chunk


_NO_NULLS: Mapping[str, NDArray[np.bool_]] = MappingProxyType({})


def _row_count_mismatch(headers: ChunkHeaders, n: int) -> RowCountMismatch:
    return RowCountMismatch(
        f"header {H_ROW_COUNT!r} says {headers.row_count} rows but the payload has {n}",
        header=H_ROW_COUNT,
        expected=str(headers.row_count),
        found=str(n),
    )


def _read_checked(payload: bytes, headers: ChunkHeaders) -> DecodedChunk | None:
    """The chunk when ``payload`` has a layout whose columns passed ``decode_chunk``'s checks
    before (see :class:`~rowbatch.wire.codec_arrow.Layout`); None otherwise."""
    checked = read_checked(payload)
    if checked is None:
        return None
    arrays, layout = checked
    if layout.rows != headers.row_count:
        raise _row_count_mismatch(headers, layout.rows)
    return DecodedChunk._of(
        headers=headers,
        columns=MappingProxyType(arrays),
        types=layout.types,
        null_masks=_NO_NULLS,
        row_count=layout.rows,
        shared_types=True,
    )


def decode_chunk(
    payload: bytes | bytearray | memoryview,
    attributes: Mapping[str, str],
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
) -> DecodedChunk:
    """Decodes and validates one message. ``attributes`` are the Pub/Sub attributes, or
    ``kafka_headers_to_attributes(record.headers)``. Raises a :class:`WireError` subclass (with
    a dead-letter ``reason``) for anything that does not follow the contract."""
    headers = ChunkHeaders.from_attributes(attributes)
    layout: Layout | None = None
    if headers.content_type is Encoding.JSON:
        cols = decode_json(payload)
        names = [c.name for c in cols]
    else:
        if schema is None and type(payload) is bytes:
            chunk = _read_checked(payload, headers)
            if chunk is not None:
                return chunk
        names, cols, layout = decode_arrow_laid_out(payload)
    for name in names:
        if type(name) is not str or not 0 < len(name) <= MAX_COLUMN_NAME_LEN:
            check_column_name(name)
    if len(set(names)) != len(names):
        dup = next(name for name in names if names.count(name) > 1)
        raise DuplicateColumn(
            f"column {dup!r} appears {names.count(dup)} times", column=dup, found="duplicate"
        )
    lengths = {col.values.shape[0] for col in cols}
    # Names are unique by now, so check_columns only has no columns or unequal lengths to find.
    n = lengths.pop() if len(lengths) == 1 else check_columns(cols)
    if n != headers.row_count:
        raise _row_count_mismatch(headers, n)
    if layout is not None and schema is None:
        layout.checked = True  # names valid and unique, lengths equal: for all of its chunks
    table_schema = as_table_schema(schema)
    if table_schema is not None:
        table_schema.check({c.name: c for c in cols})
    values: dict[str, NDArray[Any]] = {}
    types: dict[str, ColumnType] = {}
    nulls: dict[str, NDArray[np.bool_]] = {}
    for c in cols:
        values[c.name] = c.values
        types[c.name] = c.type
        if c.nulls is not None:
            nulls[c.name] = c.nulls
    return DecodedChunk._of(
        headers=headers,
        columns=MappingProxyType(values),
        types=MappingProxyType(types),
        null_masks=MappingProxyType(nulls),
        row_count=n,
    )
