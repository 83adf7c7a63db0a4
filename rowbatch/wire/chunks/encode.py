"""Caller data -> one chunk ready to publish (:func:`encode_chunk`): the columns converted and
checked, the payload in either encoding, the headers."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.codec_arrow import Compression, encode_arrow
from rowbatch.wire.codec_json.encode import encode_json
from rowbatch.wire.columns.caller_data import ColumnData, to_column
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.columns.schema import TableSchema, as_table_schema, check_columns
from rowbatch.wire.errors import MissingColumn
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import Encoding, attributes_size


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


@dataclass(frozen=True)
class EncodeOptions:
    """What a chunk is stamped and packed with beyond its rows and their types: the
    ``ordering_key`` header (None: none), the ``produced_at`` header (None: the time of
    encoding) and the payload's ``compression`` (Arrow only; None: uncompressed)."""

    ordering_key: str | None = None
    produced_at: datetime | None = None
    compression: Compression | None = None


NO_OPTIONS: Final = EncodeOptions()
"""The defaults: no ordering key, stamped when encoded, uncompressed."""


def build_columns(
    columns: Mapping[str, ColumnData],
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    null_masks: Mapping[str, NDArray[np.bool_] | Sequence[bool]] | None = None,
) -> list[Column]:
    """Caller data -> canonical columns, checked against ``schema`` (types given there are used
    instead of inference) and against each other (equal lengths)."""
    table_schema = as_table_schema(schema)
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
    check_columns(cols)
    if table_schema is not None:
        table_schema.check({c.name: c for c in cols})
    return cols


def encode_payload(
    cols: Sequence[Column], encoding: Encoding, compression: Compression | None
) -> bytes:
    """The payload of ``cols`` in ``encoding`` (``compression``: Arrow only)."""
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
    options: EncodeOptions = NO_OPTIONS,
) -> EncodedChunk:
    """Encodes one chunk.

    ``columns`` maps names to numpy arrays (``np.ma`` masked arrays mark nulls; 2-D numeric
    arrays are vectors), pyarrow arrays or sequences of Python values (``None`` = null). Types
    are inferred unless ``schema`` gives them. ``encoding`` is an :class:`Encoding` or
    ``"json"``/``"arrow"``. ``chunk_id`` is the idempotency key: keep it and reuse it when
    re-sending the same rows; a random UUID is used when omitted (read it back from
    ``.headers.chunk_id``). ``options``: the ordering key and production time the headers
    carry, and the compression of the IPC buffers (Arrow only).
    """
    enc = Encoding.parse(encoding)
    cols = build_columns(columns, schema=schema, null_masks=null_masks)
    headers = headers_for(
        table,
        cols,
        enc,
        chunk_id=chunk_id,
        produced_at=options.produced_at,
        ordering_key=options.ordering_key,
    )
    return EncodedChunk(encode_payload(cols, enc, options.compression), headers)


def headers_for(
    table: str,
    cols: Sequence[Column],
    enc: Encoding,
    *,
    chunk_id: str | None,
    produced_at: datetime | None,
    ordering_key: str | None,
) -> ChunkHeaders:
    """The headers of a chunk of ``cols`` (a random UUID when ``chunk_id`` is None, the current
    time when ``produced_at`` is)."""
    extra: dict[str, Any] = {} if produced_at is None else {"produced_at": produced_at}
    return ChunkHeaders(
        chunk_id=str(uuid.uuid4()) if chunk_id is None else chunk_id,
        table=table,
        row_count=len(cols[0]),
        content_type=enc,
        ordering_key=ordering_key,
        **extra,
    )
