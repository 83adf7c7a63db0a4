"""Rows too many for one message -> several chunks that each fit a byte limit
(:func:`split_rows`), cut deterministically so a re-send yields the same parts and ids; and the
brokers' message limits."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Final, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.wire.chunks.encode import (
    NO_OPTIONS,
    EncodedChunk,
    EncodeOptions,
    build_columns,
    encode_payload,
    headers_for,
)
from rowbatch.wire.columns.caller_data import ColumnData
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import ColumnType, Kind
from rowbatch.wire.columns.schema import TableSchema
from rowbatch.wire.errors import RowTooLarge
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import Encoding, attributes_size

#: Pub/Sub's limit on one message (data plus attributes).
PUBSUB_MAX_MESSAGE_BYTES: Final = 10_000_000
#: Kafka's default ``max.message.bytes`` (broker) / ``max.request.size`` (producer) is ~1 MiB.
KAFKA_DEFAULT_MAX_MESSAGE_BYTES: Final = 1_048_576


def split_rows(
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str | None = None,
    *,
    max_bytes: int,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    null_masks: Mapping[str, NDArray[np.bool_] | Sequence[bool]] | None = None,
    options: EncodeOptions = NO_OPTIONS,
) -> list[EncodedChunk]:
    """Encodes the rows as one or more chunks, each of whose :attr:`EncodedChunk.size` (payload
    plus attributes) is at most ``max_bytes``; rows keep their order.

    If everything fits, the result is one chunk with id ``chunk_id``. Otherwise the parts get ids
    ``f"{chunk_id}.{part}"`` (part = 0, 1, ...). The cut is a deterministic function of the rows,
    the encoding options and ``max_bytes``: re-sending the same rows with the same settings
    yields the same parts and ids. A row that alone encodes over ``max_bytes`` raises
    :class:`~rowbatch.wire.errors.RowTooLarge` naming its index and size. ``options``: as for
    :func:`~rowbatch.wire.chunks.encode.encode_chunk` (every part gets the same ordering key and
    production time).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    enc = Encoding.parse(encoding)
    cols = build_columns(columns, schema=schema, null_masks=null_masks)
    n = len(cols[0])
    base_id = str(uuid.uuid4()) if chunk_id is None else chunk_id
    ordering_key, compression = options.ordering_key, options.compression
    whole = headers_for(
        table,
        cols,
        enc,
        chunk_id=base_id,
        produced_at=options.produced_at,
        ordering_key=ordering_key,
    )
    produced_at = whole.produced_at  # one timestamp for all parts
    payload = encode_payload(cols, enc, compression)
    if len(payload) + attributes_size(whole.to_attributes()) <= max_bytes:
        return [EncodedChunk(payload, whole)]
    if n <= 1:
        size = len(payload) + attributes_size(whole.to_attributes())
        raise _row_too_large(0 if n else None, size, max_bytes)

    # Header size of the largest part id and row count: an upper bound for every part.
    worst_headers = headers_for(
        table,
        cols,
        enc,
        chunk_id=f"{base_id}.{n - 1}",
        produced_at=produced_at,
        ordering_key=ordering_key,
    )
    header_bytes = attributes_size(worst_headers.to_attributes())

    def encode_range(start: int, stop: int) -> bytes:
        return encode_payload([c.slice(start, stop) for c in cols], enc, compression)

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
        import pyarrow.compute as pc  # noqa: PLC0415 (12 MiB and 0.2 s: only when splitting)

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
