"""A shadow rollout's comparison table read back from the store the ``[sink]`` names, as one
pyarrow Table (``rowbatch-consumer compare``): the columns the sink wrote, NULLs as nulls,
vectors as lists, whichever the store.

Each store is read as its sink writes it: SQLite's declared types name the dtype (a vector is
a little-endian BLOB, ``BLOB_F32(384)``; :mod:`rowbatch.consumer.sinks.sqlite.table`);
PostgreSQL widens integers to ``bigint`` and stores vectors as arrays (``real[]``); a Parquet
dataset is one table per root, so the comparison table is the dataset beside the results'
(:func:`parquet_root`); Iceberg's is ``namespace.table`` in the SQL catalog. Nothing is written:
SQLite is opened read-only, the Iceberg catalog's own tables are not created."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

from rowbatch.consumer.rollout.read_sql import read_postgres, read_sqlite
from rowbatch.consumer.rollout.table_where import ReadFailed, TableMissing, Where
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)

SinkSettings = SqliteSinkSettings | PostgresSinkSettings | ParquetSinkSettings | IcebergSinkSettings


def parquet_root(url: str, table: str) -> str:
    """The Parquet dataset of ``table`` when the results' dataset is at ``url``: its sibling
    named ``table`` (``s3://lake/scores`` -> ``s3://lake/scores_candidate``); a ``table``
    with a ``/`` is a dataset's path or URL already."""
    if "/" in table:
        return table
    if "://" not in url:
        return str(Path(url).resolve().parent / table)
    parts = urlsplit(url.rstrip("/"))
    folder = parts.path.rpartition("/")[0]
    if not parts.path.strip("/"):
        raise ValueError(
            f"[sink] url {url!r} is a bucket's root: its comparison dataset has no sibling "
            "there; give the comparison dataset's URL as model.candidate.table (compare: --table)"
        )
    return f"{parts.scheme}://{parts.netloc}{folder}/{table}"


def locate(sink: SinkSettings, table: str) -> Where:
    """Where ``table`` of ``sink``'s store is, for messages."""
    if isinstance(sink, PostgresSinkSettings):
        from rowbatch.consumer.sinks.postgres.dsn import describe  # noqa: PLC0415

        dsn = sink.dsn.get_secret_value()
        return Where(f"{sink.db_schema}.{table}", f"PostgreSQL database {describe(dsn)}")
    if isinstance(sink, ParquetSinkSettings):
        return Where(table, f"Parquet dataset {parquet_root(sink.url, table)}")
    if isinstance(sink, IcebergSinkSettings):
        return Where(f"{sink.namespace}.{table}", f"Iceberg catalog {sink.catalog_name}")
    return Where(table, f"SQLite database {sink.path}")


def read_comparison(sink: SinkSettings, table: str) -> pa.Table:
    """Every row of ``table`` in ``sink``'s store (:class:`TableMissing`, :class:`ReadFailed`);
    large strings, binaries and lists made plain ones."""
    where = locate(sink, table)
    if isinstance(sink, PostgresSinkSettings):
        found = read_postgres(sink.dsn.get_secret_value(), sink.db_schema, table, where)
    elif isinstance(sink, ParquetSinkSettings):
        found = _read_parquet(parquet_root(sink.url, table), where)
    elif isinstance(sink, IcebergSinkSettings):
        found = _read_iceberg(sink, table, where)
    else:
        found = read_sqlite(sink.path, table, where)
    return _plain(found)


def _plain(table: pa.Table) -> pa.Table:
    def plain(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(kind):
            return pa.string()
        if pa.types.is_large_binary(kind):
            return pa.binary()
        if pa.types.is_large_list(kind) or pa.types.is_list(kind):
            return pa.list_(plain(kind.value_type))
        return kind

    schema = pa.schema([pa.field(f.name, plain(f.type)) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


def _read_parquet(root_url: str, where: Where) -> pa.Table:
    """The dataset's visible files, as the Parquet sink's own :class:`DatasetFiles` lists them
    (a table with no column when it has none yet)."""
    import pyarrow.fs as pafs  # noqa: PLC0415

    from rowbatch.consumer.sinks.parquet.files import DatasetFiles  # noqa: PLC0415
    from rowbatch.consumer.sinks.parquet.files import locate as locate_files  # noqa: PLC0415

    try:
        fs, root = locate_files(root_url)
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            raise TableMissing(f"no table {where}: the dataset does not exist")
        files = DatasetFiles(fs, root, compression="snappy")
        parts = [files.read(rel) for rel in sorted(files.data_files())]
        return pa.concat_tables(parts) if parts else pa.table({})
    except (OSError, pa.ArrowException) as exc:
        raise ReadFailed(f"reading {where} failed: {exc}") from exc


# --- Iceberg -----------------------------------------------------------------------------------


def _read_iceberg(sink: IcebergSinkSettings, table: str, where: Where) -> pa.Table:
    """A scan of ``namespace.table`` in pyiceberg's SQL catalog, opened as the Iceberg sink
    opens it (its properties, ``uri`` and ``warehouse``)."""
    import sqlalchemy as sa  # noqa: PLC0415
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: PLC0415
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError  # noqa: PLC0415

    properties = {
        **sink.properties,
        "uri": sink.catalog_uri.get_secret_value(),
        "warehouse": sink.warehouse,
        "init_catalog_tables": "false",
    }
    try:
        catalog = SqlCatalog(sink.catalog_name, **properties)
    except sa.exc.SQLAlchemyError as exc:
        raise ReadFailed(f"opening the catalog of {where} failed: {exc}") from exc
    try:
        if not sa.inspect(catalog.engine).has_table("iceberg_tables"):
            raise TableMissing(f"no table {where}: the catalog holds no table yet")
        found = catalog.load_table(f"{sink.namespace}.{table}")
        return found.scan().to_arrow()
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise TableMissing(f"no table {where}") from exc
    except (sa.exc.SQLAlchemyError, OSError, pa.ArrowException) as exc:
        raise ReadFailed(f"reading {where} failed: {exc}") from exc
    finally:
        catalog.engine.dispose()


__all__ = [
    "SinkSettings",
    "locate",
    "parquet_root",
    "read_comparison",
]
