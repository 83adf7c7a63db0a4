"""Publishing rows that may not fit one message: encode them as one chunk or, split to the
publisher's message limit, as parts ``<chunk_id>.0``, ``.1``..."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.messages import PublishedChunk
from rowbatch.wire.chunks.encode import NO_OPTIONS, EncodedChunk, EncodeOptions
from rowbatch.wire.chunks.split import split_rows
from rowbatch.wire.columns.caller_data import ColumnData
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.columns.schema import TableSchema
from rowbatch.wire.headers.fields import Encoding


def split_for(
    publisher: Publisher,
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str,
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    options: EncodeOptions = NO_OPTIONS,
) -> list[EncodedChunk]:
    """:func:`~rowbatch.wire.chunks.split.split_rows` with the publisher's message limit
    (CPU-bound: call it in a worker thread from async code)."""
    return split_rows(
        table,
        columns,
        encoding,
        chunk_id,
        max_bytes=publisher.max_chunk_bytes,
        schema=schema,
        options=options,
    )


async def publish_rows(
    publisher: Publisher,
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str,
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    options: EncodeOptions = NO_OPTIONS,
) -> list[PublishedChunk]:
    """Encodes the rows as one chunk, or as parts ``<chunk_id>.0``, ``.1``... when one message
    cannot hold them, and publishes them (concurrently; in order per ordering key, which
    ``options`` gives with the production time and the compression)."""
    chunks = await asyncio.to_thread(
        split_for, publisher, table, columns, encoding, chunk_id, schema=schema, options=options
    )
    key = options.ordering_key
    ids = await asyncio.gather(*(publisher.publish(c, key=key) for c in chunks))
    return [
        PublishedChunk(c.headers.chunk_id, c.headers.row_count, c.size, message_id)
        for c, message_id in zip(chunks, ids, strict=True)
    ]


__all__ = ["publish_rows", "split_for"]
