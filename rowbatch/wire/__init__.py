"""The row-chunk wire contract, shared by the publishing side (``producer``) and the
subscriber (``consumer``): message headers, column types, the JSON and Arrow codecs, the
errors that name a broken contract, and the dead-letter attributes. The contract in prose is
``docs/wire-format.md``.

This is the contract's public API for users, each name imported from the module that defines
it; it is the one package of ``rowbatch.wire`` that re-exports (code inside ``rowbatch`` imports
from the defining modules):

- :func:`encode_chunk` columns -> :class:`EncodedChunk` (payload bytes + :class:`ChunkHeaders`)
  (:class:`EncodeOptions`: the ordering key, production time and compression)
- :func:`split_rows` the same, cut into several chunks that each fit a byte limit
- :func:`decode_chunk` payload + attributes -> :class:`DecodedChunk` (typed numpy columns)
- :class:`ChunkHeaders` attributes (Pub/Sub) / headers (Kafka) of a chunk
- :class:`ColumnType`, :class:`TableSchema` column types and an optional expected schema
- errors: :class:`WireError` and its subclasses, each with a ``reason``
"""

from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, EncodeOptions, build_columns, encode_chunk
from rowbatch.wire.chunks.split import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    PUBSUB_MAX_MESSAGE_BYTES,
    split_rows,
)
from rowbatch.wire.codec_arrow import Compression
from rowbatch.wire.columns.caller_data import ColumnData
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    ColumnType,
    Kind,
)
from rowbatch.wire.columns.schema import TableSchema
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
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import (
    FORMAT_VERSION,
    H_CHUNK_ID,
    H_CONTENT_TYPE,
    H_FORMAT_VERSION,
    H_ORDERING_KEY,
    H_PRODUCED_AT,
    H_ROW_COUNT,
    H_TABLE,
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
    "EncodeOptions",
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
