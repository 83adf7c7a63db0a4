"""The PostgreSQL result table and its statements: creating it (and its schema) if absent,
checking that an existing one fits, the per-connection staging table, and the ``COPY``,
``INSERT ... ON CONFLICT DO NOTHING`` and ``DELETE`` the sink runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

from rowbatch.consumer.sinks.base import TableMismatch, check_column_types
from rowbatch.consumer.sinks.postgres.copy_binary import PgColumn

_Conn = psycopg.AsyncConnection[Any]

_STAGING: Final = "rowbatch_staging"
#: Arrays carry no length in their type: vector columns record theirs as a comment.
_VECTOR_COMMENT: Final = "rowbatch vector: "


def _comment(col: PgColumn) -> str:
    return f"{_VECTOR_COMMENT}{col.spec.dtype}[{col.spec.dim}]"


@dataclass(frozen=True)
class Statements:
    """``COPY`` into staging, ``INSERT`` from staging, ``DELETE`` of chunks (``%s``: a list
    of chunk ids)."""

    copy: sql.Composed
    insert: sql.Composed
    delete: sql.Composed


@dataclass(frozen=True)
class PgTable:
    """The table ``schema.name`` with ``columns`` between the key columns and the model
    columns, in the database ``where`` (``host:port/dbname``)."""

    schema: str
    name: str
    columns: tuple[PgColumn, ...]
    where: str

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name} on {self.where}"

    def _target(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def _all_columns(self) -> list[tuple[str, str]]:
        return [
            ("chunk_id", "text"),
            ("row_index", "bigint"),
            ("source_message_id", "text"),
            *((c.name, c.pg_type) for c in self.columns),
            ("model_name", "text"),
            ("model_version", "text"),
            ("processed_at", "timestamp with time zone"),
        ]

    def _definitions(self) -> sql.Composed:
        return sql.SQL(", ").join(
            sql.SQL("{} {}").format(
                sql.Identifier(name),
                sql.SQL(pg_type + (" NOT NULL" if name in ("chunk_id", "row_index") else "")),
            )
            for name, pg_type in self._all_columns()
        )

    def statements(self) -> Statements:
        names = sql.SQL(", ").join(sql.Identifier(n) for n, _ in self._all_columns())
        staging = sql.Identifier(_STAGING)
        return Statements(
            copy=sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(staging, names),
            insert=sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT (chunk_id, row_index) DO NOTHING"
            ).format(self._target(), names, names, staging),
            delete=sql.SQL("DELETE FROM {} WHERE chunk_id = ANY(%s)").format(self._target()),
        )

    async def create_staging(self, conn: _Conn) -> None:
        """The connection's temporary staging table (``ON COMMIT DELETE ROWS``)."""
        await conn.execute(
            sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                sql.Identifier(_STAGING), self._definitions()
            )
        )

    async def ensure(self, conn: _Conn) -> None:
        """Creates the schema and the table if absent, else checks the table fits; concurrent
        callers (many replicas) serialise on an advisory lock."""
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"rowbatch-sink:{self.schema}.{self.name}",),
            )
            found = await (
                await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
            ).fetchone()
            if found is None:
                await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            relation = await (
                await conn.execute(
                    "SELECT c.oid, c.relkind FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = %s AND c.relname = %s",
                    (self.schema, self.name),
                )
            ).fetchone()
            if relation is None:
                await self._create(conn)
                return
            oid, kind = relation
            if kind not in ("r", "p"):
                raise TableMismatch(
                    f"{self.label} exists but is not a table (relkind {kind!r})",
                    column="chunk_id",
                )
            await self._check(conn, oid)

    async def _create(self, conn: _Conn) -> None:
        await conn.execute(
            sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY (chunk_id, row_index))").format(
                self._target(), self._definitions()
            )
        )
        for col in self.columns:
            if col.dim:
                await conn.execute(
                    sql.SQL("COMMENT ON COLUMN {} IS {}").format(
                        sql.Identifier(self.schema, self.name, col.name),
                        sql.Literal(_comment(col)),
                    )
                )

    async def _check(self, conn: _Conn, oid: int) -> None:
        cur = await conn.execute(
            "SELECT attnum, attname, format_type(atttypid, atttypmod), attnotnull, atthasdef"
            " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            (oid,),
        )
        found = {row[1]: row for row in await cur.fetchall()}
        names = {row[0]: row[1] for row in found.values()}
        wanted = self._all_columns()
        check_column_types(
            f"existing table {self.label}", {n: row[2] for n, row in found.items()}, wanted
        )
        await self._check_dims(conn, oid)
        known = {column for column, _ in wanted}
        for _, column, _, not_null, has_default in found.values():
            if column not in known and not_null and not has_default:
                raise TableMismatch(
                    f"existing table {self.label} has an extra NOT NULL column {column!r}"
                    " without a default",
                    column=column,
                )
        cur = await conn.execute(
            "SELECT indkey::int2[] FROM pg_index WHERE indrelid = %s AND indisunique"
            " AND indpred IS NULL AND indexprs IS NULL",
            (oid,),
        )
        keys = [{names.get(k) for k in row[0]} for row in await cur.fetchall()]
        if {"chunk_id", "row_index"} not in keys:
            raise TableMismatch(
                f"existing table {self.label} has no primary key or unique index on"
                " (chunk_id, row_index)",
                column="chunk_id",
            )

    async def _check_dims(self, conn: _Conn, oid: int) -> None:
        """Vector columns hold vectors of the spec's length: by the comment this sink leaves,
        or, on a table made elsewhere, by one stored row."""
        for col in self.columns:
            if not col.dim:
                continue
            cur = await conn.execute(
                "SELECT col_description(attrelid, attnum) FROM pg_attribute"
                " WHERE attrelid = %s AND attname = %s AND NOT attisdropped",
                (oid, col.name),
            )
            row = await cur.fetchone()
            if row is None:
                continue  # a missing column is reported with the type check
            comment = row[0] or ""
            if comment.startswith(_VECTOR_COMMENT):
                if comment != _comment(col):
                    raise TableMismatch(
                        f"existing table {self.label}: column {col.name!r} holds"
                        f" {comment.removeprefix(_VECTOR_COMMENT)} vectors,"
                        f" expected {col.spec.dtype}[{col.dim}]",
                        column=col.name,
                    )
                continue
            cur = await conn.execute(
                sql.SQL("SELECT cardinality({}) FROM {} WHERE {} IS NOT NULL LIMIT 1").format(
                    sql.Identifier(col.name), self._target(), sql.Identifier(col.name)
                )
            )
            sample = await cur.fetchone()
            if sample is not None and sample[0] != col.dim:
                raise TableMismatch(
                    f"existing table {self.label}: column {col.name!r} holds vectors of"
                    f" {sample[0]} elements, expected {col.dim}",
                    column=col.name,
                )
