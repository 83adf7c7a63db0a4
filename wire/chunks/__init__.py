"""The row-chunk wire contract: one message = one chunk of rows of one logical table.

Public API (the contract itself is ``docs/wire-format.md``):

- :func:`encode_chunk` columns -> :class:`EncodedChunk` (payload bytes + :class:`ChunkHeaders`)
- :func:`split_rows` the same, cut into several chunks that each fit a byte limit
- :func:`decode_chunk` payload + attributes -> :class:`DecodedChunk` (typed numpy columns)
- :class:`ChunkHeaders` attributes (Pub/Sub) / headers (Kafka) of a chunk
- :class:`ColumnType`, :class:`TableSchema` column types and an optional expected schema
- errors: :class:`~rowbatch.wire.errors.WireError` and its subclasses, each with a ``reason``

Encoding is :mod:`~rowbatch.wire.chunks.encode`, splitting :mod:`~rowbatch.wire.chunks.split`,
decoding
:mod:`~rowbatch.wire.chunks.decode`.
"""

from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, build_columns, encode_chunk
from rowbatch.wire.chunks.split import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    PUBSUB_MAX_MESSAGE_BYTES,
    split_rows,
)
from rowbatch.wire.codec_arrow import Compression
from rowbatch.wire.columns import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    Column,
    ColumnData,
    ColumnType,
    Kind,
    TableSchema,
)
from rowbatch.wire.errors import (
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
from rowbatch.wire.headers import (
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
    derive_chunk_id,
    kafka_headers_to_attributes,
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
