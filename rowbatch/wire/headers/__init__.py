"""Chunk headers: Pub/Sub message attributes or Kafka record headers (all string-valued).

:mod:`~rowbatch.wire.headers.fields` holds the names, encodings, timestamp form and the rules for
each value; :mod:`~rowbatch.wire.headers.chunk_headers` the :class:`ChunkHeaders` value that carries
them. See ``docs/wire-format.md`` for the contract; the names and rules here are its source of
truth.

Import a name from the module that defines it: this package re-exports nothing.
"""
