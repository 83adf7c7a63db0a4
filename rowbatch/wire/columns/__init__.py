"""Column types of the wire contract and the conversions between caller data, the canonical
numpy form that :func:`rowbatch.wire.chunks.decode.decode_chunk` returns, and Arrow arrays.

- :mod:`~rowbatch.wire.columns.column_type`: :class:`Kind`, :class:`ColumnType` and the scalar types
- :mod:`~rowbatch.wire.columns.canonical`: :class:`Column`, the canonical numpy form, value checks
- :mod:`~rowbatch.wire.columns.schema`: :class:`TableSchema` and the checks on a chunk's columns
- :mod:`~rowbatch.wire.columns.caller_data`: :func:`to_column`, caller data -> canonical
- :mod:`~rowbatch.wire.columns.arrow`: Arrow types and arrays <-> column types and canonical columns

Import a name from the module that defines it: this package re-exports nothing.
"""
