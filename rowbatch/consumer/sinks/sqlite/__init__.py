"""The embedded default sink: one SQLite file, no set-up.

Table layout (created if absent; an existing table must have these declared types)::

    chunk_id           TEXT    NOT NULL  -- PRIMARY KEY (chunk_id, row_index)
    row_index          INTEGER NOT NULL
    source_message_id  TEXT
    <passthrough>      see below (NULL where the input was null)
    <outputs>          see below
    model_name         TEXT
    model_version      TEXT
    processed_at       TEXT    -- ISO-8601 UTC, microseconds: 2024-05-01T12:00:00.123456+00:00

The declared type names the column's dtype, with SQLite's usual affinity: ``INT64``, ``UINT32``...
(INTEGER), ``FLOAT32``, ``FLOAT64`` (REAL: an 8-byte double, exact for float32 values),
``BOOLEAN`` (0/1), ``TEXT``, ``BLOB`` (bytes). A vector column (``dim > 0``) is declared
``BLOB_F32(384)`` (``F16``, ``F64``, ``I8``...``I64``, ``UI8``..., ``B8`` for bool) and holds
``dim`` little-endian values of that type, so a 384-dim float32 vector is a 1,536-byte BLOB.
Read it back with ``numpy.frombuffer(blob, dtype="<f4")`` (``"<f8"``, ``"<i8"``, ``"u1"``...).

The database runs in WAL mode (readers never block the writer) with ``synchronous=FULL``: each
``write`` is one transaction, durable when it returns. ``INSERT OR IGNORE`` on the primary key
makes writes idempotent: a row already present is left as it is.

Text is stored as is, U+0000 included (SQLite's TEXT is length-counted); bytes are BLOBs.

Modules: ``table`` (declared types, creating and checking the table), ``rows`` (rows as
parameter tuples), ``faults`` (:func:`classify_sqlite_error`), ``db`` (the transaction wrapper
the Parquet key index uses too), ``sink`` (:class:`SqliteSink`).

Import a name from the module that defines it: this package re-exports nothing.
"""
