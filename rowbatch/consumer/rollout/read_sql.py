"""The comparison table read back from SQLite and PostgreSQL (:mod:`.read_table`): SQLite's
declared types name the dtype (a vector is a little-endian BLOB, ``BLOB_F32(384)``;
:mod:`rowbatch.consumer.sinks.sqlite.table`); PostgreSQL widens integers to ``bigint`` and
stores vectors as arrays (``real[]``). SQLite is opened read-only."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from rowbatch.consumer.rollout.table_where import ReadFailed, TableMissing, Where
from rowbatch.consumer.sinks.base import first_line

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


def read_sqlite(path: Path, table: str, where: Where) -> pa.Table:
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


def read_postgres(dsn: str, schema: str, table: str, where: Where) -> pa.Table:
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
