"""Reading tables to publish or to run in table mode: CSV, JSON Lines or Parquet, from a file or
stdin, streamed in record batches (never the whole file in memory, except Parquet from stdin),
cut into chunks of exactly N rows, and converted to the wire contract's column types with errors
that name the file, the column and the row.

- :func:`open_source` opens a file (``-`` = stdin) as a :class:`TableFileReader` (one module per
  format: ``csv``, ``jsonl``, ``parquet``);
- :func:`rechunk` cuts its record batches into tables of ``rows`` rows;
- :func:`wire_columns` converts one such table to the columns
  :func:`~rowbatch.wire.chunks.split.split_rows` takes, applying the declared schema
  (``--schema``) or inferring the types;
- :func:`parse_schema` reads ``id:int64,text:string,features:vector[float32,16]``.

CSV: the first line is the header; empty cells and ``null``/``NULL`` are nulls in non-string
columns (a string column keeps ``""``); ``NaN``/``inf`` are float values. A vector cell is a JSON
array (``"[0.1, 0.2]"``). JSON Lines: one object per line; arrays of numbers are vectors.
Compressed files (``.gz``, ``.bz2``, ``.zst``, ``.lz4``) are read as such.

A layer of its own between the wire contract (which it converts into, and the only part of
rowbatch it imports) and its two users, the producer's ``publish`` and the consumer's table
mode; not part of the contract itself.

Import a name from the module that defines it: this package re-exports nothing.
"""
