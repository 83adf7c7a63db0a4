"""Result rows in a PostgreSQL table, written with binary ``COPY`` and ``ON CONFLICT DO NOTHING``.

Table layout (created if absent, in ``schema``, which is created too if absent)::

    chunk_id           text NOT NULL           -- PRIMARY KEY (chunk_id, row_index)
    row_index          bigint NOT NULL
    source_message_id  text
    <passthrough>      see below (NULL where the input was null)
    <outputs>          see below
    model_name         text
    model_version      text
    processed_at       timestamptz

==========================================  ================  ==========================
``ColumnSpec.dtype``                        scalar            vector (``dim > 0``)
==========================================  ================  ==========================
``int8``...``int64``, ``uint8``...``uint32``  ``bigint``        ``bigint[]``
``float16``, ``float32``                    ``real``          ``real[]``
``float64``                                 ``double precision``  ``double precision[]``
``bool``                                    ``boolean``       ``boolean[]``
``object`` / ``str`` (text)                 ``text``          (not supported)
``bytes``                                   ``bytea``         (not supported)
==========================================  ================  ==========================

An existing table must have each of these columns with exactly this type and a primary key
(or unique index) on ``(chunk_id, row_index)``; extra columns are fine when nullable or
defaulted. Otherwise ``open`` raises :class:`~rowbatch.consumer.sinks.base.TableMismatch` naming the
column. Concurrent ``open`` calls (many replicas) serialise on an advisory lock.

A ``write`` is one transaction: the rows are encoded (vectorised, in a worker thread) into
PostgreSQL's binary ``COPY`` format, copied into a per-connection temporary staging table
(``ON COMMIT DELETE ROWS``), then ``INSERT INTO target SELECT ... FROM staging ON CONFLICT
(chunk_id, row_index) DO NOTHING``. Rows already present are left as they are.

If the connection drops (``OperationalError`` with the connection broken), the operation is
retried once on a fresh connection; the retry is safe since writes and deletes are idempotent.
Faults are classified by SQLSTATE (:func:`classify_pg_error`, in ``faults``). Messages name
``host:port/dbname``, never the DSN or its password.

Modules: ``dsn`` (what messages may say of the DSN), ``copy_binary`` (column types and the
binary ``COPY`` encoding), ``table`` (creating and checking the table, the statements),
``faults`` (classification by SQLSTATE), ``sink`` (:class:`PostgresSink`: connection and writes).

Import a name from the module that defines it: this package re-exports nothing.
"""
