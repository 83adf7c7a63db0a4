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

import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

from rowbatch.consumer.sinks.base import first_line
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)

SinkSettings = SqliteSinkSettings | PostgresSinkSettings | ParquetSinkSettings | IcebergSinkSettings


class TableMissing(Exception):
    """The table is not in the store; the message names both."""


class ReadFailed(Exception):
    """The store failed the read; the message names the table, the store and its words."""


@dataclass(frozen=True)
class Where:
    """A table as its store names it (``schema.table``, ``namespace.table``, a dataset root)
    and the store, for messages (never a password)."""

    table: str
    store: str

    def __str__(self) -> str:
        return f"{self.table} in {self.store}"


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
        found = _read_postgres(sink.dsn.get_secret_value(), sink.db_schema, table, where)
    elif isinstance(sink, ParquetSinkSettings):
        found = _read_parquet(parquet_root(sink.url, table), where)
    elif isinstance(sink, IcebergSinkSettings):
        found = _read_iceberg(sink, table, where)
    else:
        found = _read_sqlite(sink.path, table, where)
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


# --- SQLite ------------------------------------------------------------------------------------

_VECTOR: Final = re.compile(r"BLOB_([A-Z0-9]+)\(([0-9]+)\)")
_VECTOR_DTYPES: Final = {
    "B8": "u1",  # bools as 0/1 bytes
    **{f"F{b}": f"float{b}" for b in (16, 32, 64)},
    **{f"{u.upper()}I{b}": f"{u}int{b}" for u in ("", "u") for b in (8, 16, 32, 64)},
}
_SQLITE_TYPES: Final = {
    "TEXT": pa.string(),
    "INTEGER": pa.int64(),
    "BOOLEAN": pa.bool_(),
    "BLOB": pa.binary(),
    "REAL": pa.float64(),
    "FLOAT16": pa.float32(),  # as the Parquet sink stores float16
}


def _read_sqlite(path: Path, table: str, where: Where) -> pa.Table:
    from rowbatch.consumer.sinks.sqlite.table import quote  # noqa: PLC0415

    if not path.is_file():
        raise TableMissing(f"no table {where}: the database file does not exist")
    try:
        uri = path.resolve().as_uri() + "?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            info = conn.execute(f"PRAGMA table_info({quote(table)})").fetchall()
            if not info:
                raise TableMissing(f"no table {where}")
            names = [str(r[1]) for r in info]
            listed = ", ".join(quote(n) for n in names)
            rows = conn.execute(f"SELECT {listed} FROM {quote(table)}").fetchall()  # noqa: S608
        cells = list(zip(*rows, strict=True)) if rows else [() for _ in names]
        arrays = [_sqlite_column(str(r[2]), list(c)) for r, c in zip(info, cells, strict=True)]
    except (sqlite3.Error, pa.ArrowException, ValueError) as exc:
        raise ReadFailed(f"reading {where} failed: {exc}") from exc
    return pa.Table.from_arrays(arrays, names=names)


def _sqlite_column(declared: str, cells: list[Any]) -> pa.Array:
    """A column's cells as Arrow, by the type :func:`~rowbatch.consumer.sinks.sqlite.table.
    sql_type` declared (another's: as the values come)."""
    match = _VECTOR.fullmatch(declared.upper())
    if match and match[1] in _VECTOR_DTYPES:
        dtype = np.dtype(_VECTOR_DTYPES[match[1]]).newbyteorder("<")
        return _blob_vectors(cells, dtype, int(match[2]), boolean=match[1] == "B8")
    kind = _SQLITE_TYPES.get(declared.upper())
    if kind == pa.bool_():  # stored as 0 and 1
        cells = [None if c is None else bool(c) for c in cells]
    if kind is None:
        try:
            kind = pa.from_numpy_dtype(np.dtype(declared.lower()))
        except TypeError:
            return pa.array(cells)
    return pa.array(cells, type=kind)


def _blob_vectors(cells: list[Any], dtype: np.dtype[Any], dim: int, *, boolean: bool) -> pa.Array:
    valid = np.array([c is not None for c in cells], dtype=bool)
    flat = np.frombuffer(b"".join(c for c in cells if c is not None), dtype=dtype)
    values = np.zeros((len(cells), dim), dtype=dtype.newbyteorder("="))
    values[valid] = flat.reshape(-1, dim)
    elements = pa.array(values.reshape(-1).astype(bool) if boolean else values.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(elements, dim, mask=pa.array(~valid))


# --- PostgreSQL --------------------------------------------------------------------------------

_PG_TYPES: Final = {
    "text": pa.string(),
    "bigint": pa.int64(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "boolean": pa.bool_(),
    "bytea": pa.binary(),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
}
_PG_COLUMNS: Final = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
    " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped"
    " ORDER BY a.attnum"
)


def pg_arrow_type(pg_type: str) -> pa.DataType | None:
    """The Arrow type of a column the PostgreSQL sink made (``format_type``'s spelling; an
    array is a vector); ``None``: another type, taken as the values come."""
    if pg_type.endswith("[]"):
        element = pg_arrow_type(pg_type[:-2])
        return None if element is None else pa.list_(element)
    return _PG_TYPES.get(pg_type)


def pg_table(columns: list[tuple[str, str]], rows: list[tuple[Any, ...]]) -> pa.Table:
    """Rows fetched by psycopg (``columns``: each one's name and ``format_type``) as Arrow."""
    cells = list(zip(*rows, strict=True)) if rows else [() for _ in columns]
    return pa.Table.from_arrays(
        [
            pa.array(list(c), type=pg_arrow_type(t))
            for (_, t), c in zip(columns, cells, strict=True)
        ],
        names=[n for n, _ in columns],
    )


def _read_postgres(dsn: str, schema: str, table: str, where: Where) -> pa.Table:
    """``schema.table`` over one psycopg connection, as the PostgreSQL sink connects."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    from rowbatch.consumer.sinks.postgres.dsn import password  # noqa: PLC0415

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute(_PG_COLUMNS, (schema, table)).fetchall()
            if not found:
                raise TableMissing(f"no table {where}")
            columns = [(str(n), str(t)) for n, t in found]
            query = sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(n) for n, _ in columns),
                sql.Identifier(schema, table),
            )
            rows = conn.execute(query).fetchall()
    except psycopg.Error as exc:
        said, secret = first_line(exc), password(dsn)  # the database's words, never a password
        raise ReadFailed(
            f"reading {where} failed: {said.replace(secret, '***') if secret else said}"
        ) from exc
    return pg_table(columns, rows)


# --- Parquet -----------------------------------------------------------------------------------


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
    "ReadFailed",
    "SinkSettings",
    "TableMissing",
    "Where",
    "locate",
    "parquet_root",
    "read_comparison",
]
