"""The row-chunk wire contract: one message = one chunk of rows of one logical table.

The contract itself is ``docs/wire-format.md``; the public API for users is :mod:`rowbatch.wire`.
Import a name from the module that defines it: this package re-exports nothing.

- ``encode.encode_chunk``: columns -> ``EncodedChunk`` (payload bytes + ``ChunkHeaders``)
- ``split.split_rows``: the same, cut into several chunks that each fit a byte limit
- ``decode.decode_chunk``: payload + attributes -> ``DecodedChunk`` (typed numpy columns)
- :class:`ChunkHeaders` attributes (Pub/Sub) / headers (Kafka) of a chunk
- :class:`ColumnType`, :class:`TableSchema` column types and an optional expected schema
- errors: :class:`~rowbatch.wire.errors.WireError` and its subclasses, each with a ``reason``

Encoding is :mod:`~rowbatch.wire.chunks.encode`, splitting :mod:`~rowbatch.wire.chunks.split`,
decoding :mod:`~rowbatch.wire.chunks.decode`.
"""
