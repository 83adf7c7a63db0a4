"""The row-chunk wire contract: one message = one chunk of rows of one logical table.

Public API (the contract itself is ``docs/wire-format.md``):

- :func:`encode_chunk` columns -> :class:`EncodedChunk` (payload bytes + :class:`ChunkHeaders`)
- :func:`split_rows` the same, cut into several chunks that each fit a byte limit
- :func:`decode_chunk` payload + attributes -> :class:`DecodedChunk` (typed numpy columns)
- :class:`ChunkHeaders` attributes (Pub/Sub) / headers (Kafka) of a chunk
- :class:`ColumnType`, :class:`TableSchema` column types and an optional expected schema
- errors: :class:`~wire.errors.WireError` and its subclasses, each with a ``reason``
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from wire.codec_arrow import Compression, decode_arrow, encode_arrow
from wire.codec_json import decode_json, encode_json
from wire.columns import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    MAX_COLUMN_NAME_LEN,
    STRING,
    Column,
    ColumnData,
    ColumnType,
    Kind,
    TableSchema,
    check_column_name,
    to_column,
)
from wire.errors import (
    ColumnLengthMismatch,
    ColumnTypeMismatch,
    CorruptArrow,
    DuplicateColumn,
    HeaderError,
    InvalidColumnName,
    InvalidHeader,
    InvalidJson,
    InvalidValue,
    MissingColumn,
    MissingHeader,
    NoColumns,
    NullNotAllowed,
    PayloadError,
    RowCountMismatch,
    RowTooLarge,
    UnsupportedColumnType,
    UnsupportedContentType,
    UnsupportedFormatVersion,
    WireError,
)
from wire.headers import (
    FORMAT_VERSION,
    H_CHUNK_ID,
    H_CONTENT_TYPE,
    H_FORMAT_VERSION,
    H_ORDERING_KEY,
    H_PRODUCED_AT,
    H_ROW_COUNT,
    H_TABLE,
    ChunkHeaders,
    Encoding,
    attributes_size,
    derive_chunk_id,
    kafka_headers_to_attributes,
)

#: Pub/Sub's limit on one message (data plus attributes).
PUBSUB_MAX_MESSAGE_BYTES: Final = 10_000_000
#: Kafka's default ``max.message.bytes`` (broker) / ``max.request.size`` (producer) is ~1 MiB.
KAFKA_DEFAULT_MAX_MESSAGE_BYTES: Final = 1_048_576


@dataclass(frozen=True)
class EncodedChunk:
    """A chunk ready to publish: ``payload`` as the message data, ``headers`` as attributes."""

    payload: bytes
    headers: ChunkHeaders

    @property
    def attributes(self) -> dict[str, str]:
        """Pub/Sub message attributes."""
        return self.headers.to_attributes()

    @property
    def kafka_headers(self) -> list[tuple[str, bytes]]:
        return self.headers.to_kafka_headers()

    @property
    def size(self) -> int:
        """Bytes a broker counts: payload plus attribute keys and values."""
        return len(self.payload) + attributes_size(self.attributes)


@dataclass(frozen=True, eq=False)
class DecodedChunk:
    """A decoded chunk. ``columns`` keeps the payload's column order; arrays are read-only and
    in the canonical form of their type (see ``wire.columns``). ``null_masks`` has an entry
    (bool array, ``True`` = null) only for columns with at least one null."""

    headers: ChunkHeaders
    columns: Mapping[str, NDArray[Any]]
    types: Mapping[str, ColumnType]
    null_masks: Mapping[str, NDArray[np.bool_]]
    row_count: int

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
        headers: ChunkHeaders,
        columns: Mapping[str, NDArray[Any]],
        types: Mapping[str, ColumnType],
        null_masks: Mapping[str, NDArray[np.bool_]],
        row_count: int,
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
        )
        return chunk


# --- encode -----------------------------------------------------------------------------------


def _schema_types(schema: TableSchema | Mapping[str, ColumnType] | None) -> TableSchema | None:
    if schema is None or isinstance(schema, TableSchema):
        return schema
    return TableSchema(schema)


def build_columns(
    columns: Mapping[str, ColumnData],
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    null_masks: Mapping[str, NDArray[np.bool_] | Sequence[bool]] | None = None,
) -> list[Column]:
    """Caller data -> canonical columns, checked against ``schema`` (types given there are used
    instead of inference) and against each other (equal lengths)."""
    table_schema = _schema_types(schema)
    declared = table_schema.columns if table_schema is not None else {}
    masks = null_masks or {}
    unknown_masks = set(masks) - set(columns)
    if unknown_masks:
        raise MissingColumn(
            f"null_masks names column(s) not in the chunk: {sorted(unknown_masks)}",
            column=sorted(unknown_masks)[0],
        )
    cols = [
        to_column(name, data, declared.get(name), masks.get(name)) for name, data in columns.items()
    ]
    _check_columns(cols)
    if table_schema is not None:
        table_schema.check({c.name: c for c in cols})
    return cols


def _check_columns(cols: Sequence[Column]) -> int:
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


def _payload(cols: Sequence[Column], encoding: Encoding, compression: Compression | None) -> bytes:
    if encoding is Encoding.JSON:
        if compression is not None:
            raise ValueError("compression applies to the Arrow encoding only")
        return encode_json(cols)
    return encode_arrow(cols, compression)


def encode_chunk(
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str | None = None,
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    null_masks: Mapping[str, NDArray[np.bool_] | Sequence[bool]] | None = None,
    produced_at: datetime | None = None,
    ordering_key: str | None = None,
    compression: Compression | None = None,
) -> EncodedChunk:
    """Encodes one chunk.

    ``columns`` maps names to numpy arrays (``np.ma`` masked arrays mark nulls; 2-D numeric
    arrays are vectors), pyarrow arrays or sequences of Python values (``None`` = null). Types
    are inferred unless ``schema`` gives them. ``encoding`` is an :class:`Encoding` or
    ``"json"``/``"arrow"``. ``chunk_id`` is the idempotency key: keep it and reuse it when
    re-sending the same rows; a random UUID is used when omitted (read it back from
    ``.headers.chunk_id``). ``compression`` (Arrow only) compresses the IPC buffers.
    """
    enc = Encoding.parse(encoding)
    cols = build_columns(columns, schema=schema, null_masks=null_masks)
    headers = _headers(
        table, cols, enc, chunk_id=chunk_id, produced_at=produced_at, ordering_key=ordering_key
    )
    return EncodedChunk(_payload(cols, enc, compression), headers)


def _headers(
    table: str,
    cols: Sequence[Column],
    enc: Encoding,
    *,
    chunk_id: str | None,
    produced_at: datetime | None,
    ordering_key: str | None,
) -> ChunkHeaders:
    extra: dict[str, Any] = {} if produced_at is None else {"produced_at": produced_at}
    return ChunkHeaders(
        chunk_id=str(uuid.uuid4()) if chunk_id is None else chunk_id,
        table=table,
        row_count=len(cols[0]),
        content_type=enc,
        ordering_key=ordering_key,
        **extra,
    )


# --- split ------------------------------------------------------------------------------------


def split_rows(
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str | None = None,
    *,
    max_bytes: int,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    null_masks: Mapping[str, NDArray[np.bool_] | Sequence[bool]] | None = None,
    produced_at: datetime | None = None,
    ordering_key: str | None = None,
    compression: Compression | None = None,
) -> list[EncodedChunk]:
    """Encodes the rows as one or more chunks, each of whose :attr:`EncodedChunk.size` (payload
    plus attributes) is at most ``max_bytes``; rows keep their order.

    If everything fits, the result is one chunk with id ``chunk_id``. Otherwise the parts get ids
    ``f"{chunk_id}.{part}"`` (part = 0, 1, ...). The cut is a deterministic function of the rows,
    the encoding options and ``max_bytes``: re-sending the same rows with the same settings
    yields the same parts and ids. A row that alone encodes over ``max_bytes`` raises
    :class:`~wire.errors.RowTooLarge` naming its index and size.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    enc = Encoding.parse(encoding)
    cols = build_columns(columns, schema=schema, null_masks=null_masks)
    n = len(cols[0])
    base_id = str(uuid.uuid4()) if chunk_id is None else chunk_id
    whole = _headers(
        table, cols, enc, chunk_id=base_id, produced_at=produced_at, ordering_key=ordering_key
    )
    produced_at = whole.produced_at  # one timestamp for all parts
    payload = _payload(cols, enc, compression)
    if len(payload) + attributes_size(whole.to_attributes()) <= max_bytes:
        return [EncodedChunk(payload, whole)]
    if n <= 1:
        size = len(payload) + attributes_size(whole.to_attributes())
        raise _row_too_large(0 if n else None, size, max_bytes)

    # Header size of the largest part id and row count: an upper bound for every part.
    worst_headers = _headers(
        table,
        cols,
        enc,
        chunk_id=f"{base_id}.{n - 1}",
        produced_at=produced_at,
        ordering_key=ordering_key,
    )
    header_bytes = attributes_size(worst_headers.to_attributes())

    def encode_range(start: int, stop: int) -> bytes:
        return _payload([c.slice(start, stop) for c in cols], enc, compression)

    overhead = len(encode_range(0, 0)) + header_bytes
    ranges = _plan(cols, len(payload) + header_bytes, overhead, max_bytes)
    parts: list[tuple[int, int, bytes]] = []
    for start, stop in ranges:
        _fit(start, stop, encode_range, max_bytes=max_bytes, header_bytes=header_bytes, out=parts)
    chunks = []
    for i, (start, stop, part) in enumerate(parts):
        headers = ChunkHeaders(
            chunk_id=f"{base_id}.{i}",
            table=table,
            row_count=stop - start,
            content_type=enc,
            produced_at=produced_at,
            ordering_key=ordering_key,
        )
        chunks.append(EncodedChunk(part, headers))
    return chunks


def _row_too_large(row: int | None, size: int, max_bytes: int) -> RowTooLarge:
    what = f"row {row} alone" if row is not None else "a chunk without rows"
    return RowTooLarge(
        f"{what} encodes to {size} bytes with its headers, over the limit of {max_bytes} bytes",
        row_index=row,
        size=size,
        max_bytes=max_bytes,
    )


def _row_weights(col: Column) -> NDArray[np.float64]:
    """Rough per-row payload bytes (only relative sizes matter)."""
    n = len(col)
    kind = col.type.kind
    if kind in (Kind.STRING, Kind.BYTES):
        arr = pa.array(col.values, type=pa.string() if kind is Kind.STRING else pa.binary())
        lengths = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        return cast("NDArray[np.float64]", lengths.astype(np.float64) + 4.0)
    width = {Kind.INT64: 8.0, Kind.FLOAT64: 8.0, Kind.FLOAT32: 4.0, Kind.BOOL: 1.0}
    per_row = width.get(kind, 4.0 * float(col.type.dim or 0))
    return np.full(n, per_row, dtype=np.float64)


def _plan(
    cols: Sequence[Column], total: int, overhead: int, max_bytes: int
) -> list[tuple[int, int]]:
    """Cuts rows into contiguous ranges whose estimated size is under ~95% of the limit."""
    n = len(cols[0])
    weights = np.zeros(n, dtype=np.float64)
    for col in cols:
        weights += _row_weights(col)
    scale = max(total - overhead, 1) / max(float(weights.sum()), 1.0)
    cum = np.cumsum(weights * scale)
    budget = max((max_bytes - overhead) * 0.95, 1.0)
    ranges = []
    start = 0
    while start < n:
        base = float(cum[start - 1]) if start else 0.0
        stop = max(int(np.searchsorted(cum, base + budget, side="right")), start + 1)
        ranges.append((start, stop))
        start = stop
    return ranges


def _fit(
    start: int,
    stop: int,
    encode_range: Callable[[int, int], bytes],
    *,
    max_bytes: int,
    header_bytes: int,
    out: list[tuple[int, int, bytes]],
) -> None:
    """Appends (start, stop, payload) parts covering the range, halving ranges that are over."""
    payload = encode_range(start, stop)
    if len(payload) + header_bytes <= max_bytes:
        out.append((start, stop, payload))
        return
    if stop - start == 1:
        raise _row_too_large(start, len(payload) + header_bytes, max_bytes)
    mid = (start + stop) // 2
    _fit(start, mid, encode_range, max_bytes=max_bytes, header_bytes=header_bytes, out=out)
    _fit(mid, stop, encode_range, max_bytes=max_bytes, header_bytes=header_bytes, out=out)


# --- decode -----------------------------------------------------------------------------------


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
    if headers.content_type is Encoding.JSON:
        cols = decode_json(payload)
        names = [c.name for c in cols]
    else:
        names, cols = decode_arrow(payload)
    for name in names:
        if type(name) is not str or not 0 < len(name) <= MAX_COLUMN_NAME_LEN:
            check_column_name(name)
    if len(set(names)) != len(names):
        dup = next(name for name in names if names.count(name) > 1)
        raise DuplicateColumn(
            f"column {dup!r} appears {names.count(dup)} times", column=dup, found="duplicate"
        )
    lengths = {col.values.shape[0] for col in cols}
    # Names are unique by now, so _check_columns only has no columns or unequal lengths to find.
    n = lengths.pop() if len(lengths) == 1 else _check_columns(cols)
    if n != headers.row_count:
        raise RowCountMismatch(
            f"header {H_ROW_COUNT!r} says {headers.row_count} rows but the payload has {n}",
            header=H_ROW_COUNT,
            expected=str(headers.row_count),
            found=str(n),
        )
    table_schema = _schema_types(schema)
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


__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT32",
    "FLOAT64",
    "FORMAT_VERSION",
    "H_CHUNK_ID",
    "H_CONTENT_TYPE",
    "H_FORMAT_VERSION",
    "H_ORDERING_KEY",
    "H_PRODUCED_AT",
    "H_ROW_COUNT",
    "H_TABLE",
    "INT64",
    "KAFKA_DEFAULT_MAX_MESSAGE_BYTES",
    "PUBSUB_MAX_MESSAGE_BYTES",
    "STRING",
    "ChunkHeaders",
    "Column",
    "ColumnData",
    "ColumnLengthMismatch",
    "ColumnType",
    "ColumnTypeMismatch",
    "Compression",
    "CorruptArrow",
    "DecodedChunk",
    "DuplicateColumn",
    "EncodedChunk",
    "Encoding",
    "HeaderError",
    "InvalidColumnName",
    "InvalidHeader",
    "InvalidJson",
    "InvalidValue",
    "Kind",
    "MissingColumn",
    "MissingHeader",
    "NoColumns",
    "NullNotAllowed",
    "PayloadError",
    "RowCountMismatch",
    "RowTooLarge",
    "TableSchema",
    "UnsupportedColumnType",
    "UnsupportedContentType",
    "UnsupportedFormatVersion",
    "WireError",
    "build_columns",
    "decode_chunk",
    "derive_chunk_id",
    "encode_chunk",
    "kafka_headers_to_attributes",
    "split_rows",
]
