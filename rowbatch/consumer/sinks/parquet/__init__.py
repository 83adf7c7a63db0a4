"""Result rows as a Parquet dataset, hive-partitioned by day, on a local path or an object store.

Layout (``root`` is ``url_or_path``: a local path, ``file://``, ``s3://``, ``gs://``... any URI
``pyarrow.fs.FileSystem.from_uri`` knows)::

    root/processed_date=2024-05-01/part-20240501T120000123456-<uuid>.parquet   one per commit
    root/_rowbatch/keys.sqlite                                                 the key index
    root/_rowbatch/writer.json                                                 the writer lease

Readers see one table: ``pyarrow.dataset.dataset(root, partitioning="hive")``, DuckDB
``read_parquet('root/**/*.parquet', hive_partitioning = true)``, Spark ``read.parquet(root)``,
``pandas.read_parquet(root)``. Names starting with ``_`` or ``.`` (the index, files being
written) are hidden from all of them. ``processed_date`` is the UTC date of ``processed_at``.

Columns: ``chunk_id`` string, ``row_index`` int64, ``source_message_id`` string, the passthrough
and output columns (ints and floats keep their width, except ``float16`` which is stored as
``float32``; text is string, bytes binary, bool bool; a vector is ``fixed_size_list<dim>`` of its
element type), ``model_name``, ``model_version`` strings, ``processed_at`` timestamp (us, UTC).

Idempotency: the key index (SQLite) maps each written ``(chunk_id, row_index)`` to its file.
A ``write`` (1) records the keys not seen before as the partition's open file's (a *pending*
file: one per day partition, :class:`rowbatch.consumer.sinks.rolling.RollingFile`), (2) streams
those rows into it under a hidden temporary name, a row group at a time; the file is rolled
(closed) at ``target_file_bytes``. ``commit`` (the pipeline's commit stage, every
``commit_interval_s`` and at shutdown; messages are acked after it) (3) renames each closed file
to its final name (atomic; on object stores a copy, atomic per object), (4) marks it
*committed*. ``open`` reconciles a crash: a pending file that exists is committed, one that does
not is dropped with its keys. ``delete_chunks`` journals the chunk ids first, rewrites each
affected file without them (temporary file + rename; a file left empty is deleted), then drops
their keys and the journal entry; ``open`` finishes a journalled deletion a crash interrupted.
If the index is missing while the dataset has files, ``open`` rebuilds it from the files.

Limitations: one writer per dataset. A lock file next to the index makes a second sink on the
same index fail at ``open``; a sink with *another* index (another host on the same bucket, a pod
rescheduled while the old one runs) is kept off by the writer lease (``lease``): refused while
the lease is fresh (start-up waits for it), and a writer that let its lease lapse and finds it
taken stops instead of writing on. Best effort: two writers opening in the same moment on an
object store are not told apart. For many writers use the PostgreSQL or Iceberg sink. For
non-local filesystems the index is kept on local disk at
``index_path`` (required there); losing it costs a rebuild, which reads every file's keys.

Strings are stored as is, U+0000 included; the wire's bytes are ``binary``.

Faults (:func:`classify_parquet_error`, in ``faults``): a store, disk or index fault that passes
raises :class:`~rowbatch.consumer.sinks.base.SinkUnavailable`; the next call first settles what the
failed one left (as ``open`` does after a crash), so retrying the same write neither loses nor
duplicates rows. A value pyarrow cannot convert to its column's type raises
:class:`~rowbatch.consumer.sinks.base.RowsRejected` naming the column; anything else from the store
is a plain :class:`~rowbatch.consumer.sinks.base.SinkError`.

Modules: ``files`` (where the dataset lives, file naming, atomic uploads), ``rows`` (schema and
row conversion), ``index`` (the key index), ``faults`` (classification), ``sink``
(:class:`ParquetSink`).

Import a name from the module that defines it: this package re-exports nothing.
"""
