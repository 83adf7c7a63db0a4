"""Chunk headers: Pub/Sub message attributes or Kafka record headers (all string-valued).

:mod:`~rowbatch.wire.headers.fields` holds the names, encodings, timestamp form and the rules for
each value; :mod:`~rowbatch.wire.headers.chunk_headers` the :class:`ChunkHeaders` value that carries
them. See ``docs/wire-format.md`` for the contract; the names and rules here are its source of
truth.
"""

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
    MAX_CHUNK_ID_LEN,
    MAX_ORDERING_KEY_BYTES,
    MAX_TABLE_LEN,
    REQUIRED_HEADERS,
    SUPPORTED_FORMAT_VERSIONS,
    Encoding,
    attributes_size,
    check_chunk_id,
    check_table,
    derive_chunk_id,
    format_timestamp,
    kafka_headers_to_attributes,
    parse_timestamp,
)

__all__ = [
    "FORMAT_VERSION",
    "H_CHUNK_ID",
    "H_CONTENT_TYPE",
    "H_FORMAT_VERSION",
    "H_ORDERING_KEY",
    "H_PRODUCED_AT",
    "H_ROW_COUNT",
    "H_TABLE",
    "MAX_CHUNK_ID_LEN",
    "MAX_ORDERING_KEY_BYTES",
    "MAX_TABLE_LEN",
    "REQUIRED_HEADERS",
    "SUPPORTED_FORMAT_VERSIONS",
    "ChunkHeaders",
    "Encoding",
    "attributes_size",
    "check_chunk_id",
    "check_table",
    "derive_chunk_id",
    "format_timestamp",
    "kafka_headers_to_attributes",
    "parse_timestamp",
]
