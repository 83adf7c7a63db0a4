"""A comparison table written by the project's own sinks (SQLite, Parquet, Iceberg on
pyiceberg's SQL catalog over a local SQLite file and warehouse) reads back the same from every
store (rowbatch/consumer/rollout/read_table.py): the values, vectors and NULLs written; a
missing table or store is :class:`TableMissing` naming both. PostgreSQL: the type mapping and
the conversion of fetched rows (no server here).

:func:`comparison_rows` is the table the compare tests reduce: 100 rows (ids 0-99, two chunks
of 50) where the candidate differs on the rows with ``id % 10 == 7`` and fails on ids 3, 28,
53 and 78."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pydantic import SecretStr

from harness.proc import free_port
from rowbatch.consumer.rollout.comparison import comparison_spec
from rowbatch.consumer.rollout.read_sql import pg_arrow_type, pg_table
from rowbatch.consumer.rollout.read_table import (
    locate,
    parquet_root,
    read_comparison,
)
from rowbatch.consumer.rollout.table_where import ReadFailed, TableMissing
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, TableSpec
from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog
from rowbatch.consumer.sinks.iceberg.sink import IcebergSink
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink

DIM = 8
N = 100
TABLE = "scores_candidate"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RESULTS = TableSpec(
    "scores",
    passthrough=(ColumnSpec("id", "int64"),),
    outputs=(
        ColumnSpec("score", "float32"),
        ColumnSpec("label", "int32"),
        ColumnSpec("embedding", "float32", DIM),
    ),
)
SPEC = comparison_spec(RESULTS, TABLE)
IDS = np.arange(N, dtype=np.int64)
DIFFERS = IDS % 10 == 7
FAILED = {3: "deadline exceeded", 28: "deadline exceeded", 53: "deadline exceeded"}
FAILED[78] = "model rejected the request"


def production() -> dict[str, np.ndarray[Any, Any]]:
    j = np.arange(DIM)
    return {
        "score": (IDS / 10).astype(np.float32),
        "label": (IDS % 3).astype(np.int32),
        "embedding": np.sin(IDS[:, None] * 0.1 + j[None, :]).astype(np.float32),
    }


def candidate() -> dict[str, np.ndarray[Any, Any]]:
    """Production's answers but on ``DIFFERS``: score + 0.25 * (1 + id // 10) (so the row
    with the largest id differs most), label + 1 (mod 3), embedding[0] + 0.5."""
    mine = production()
    score = mine["score"].copy()
    score[DIFFERS] += (0.25 * (1 + IDS[DIFFERS] // 10)).astype(np.float32)
    label = mine["label"].copy()
    label[DIFFERS] = (label[DIFFERS] + 1) % 3
    embedding = mine["embedding"].copy()
    embedding[DIFFERS, 0] += np.float32(0.5)
    return {"score": score, "label": label, "embedding": embedding}


def comparison_rows(ids: np.ndarray[Any, Any]) -> ResultRows:
    """The comparison rows of ``ids`` (all in one chunk): production version 1 below id 75,
    3 from it; the candidate (scorer 2) failed on the ids of ``FAILED``."""
    mine, theirs = production(), candidate()
    failed = np.isin(ids, list(FAILED))
    outputs: dict[str, np.ndarray[Any, Any]] = {}
    for name in mine:
        outputs[name] = mine[name][ids]
        outputs[f"{name}__candidate"] = theirs[name][ids]
    outputs["production_version"] = np.where(ids < 75, "1", "3").astype(object)
    outputs["latency_ms"] = 10.0 + ids
    outputs["candidate_latency_ms"] = 20.0 + 2 * ids
    outputs["candidate_error"] = np.array([FAILED.get(int(i)) for i in ids], dtype=object)
    nulls = {f"{name}__candidate": failed for name in mine}
    nulls["candidate_error"] = ~failed
    return ResultRows(
        chunk_id=np.array([f"c{int(ids[0]) // 50}"] * len(ids), dtype=object),
        row_index=ids % 50,
        source_message_id=np.array([f"m{int(ids[0]) // 50}"] * len(ids), dtype=object),
        passthrough={"id": ids},
        outputs=outputs,
        nulls=nulls,
        model_name="scorer",
        model_version="2",
        processed_at=AT,
    )


CHUNKS = (IDS[:50], IDS[50:])


async def write_sqlite(path: Path, *, rows: bool = True) -> None:
    sink = SqliteSink(path)
    await sink.open(SPEC)
    for ids in CHUNKS if rows else ():
        await sink.write(comparison_rows(ids))
    await sink.close()


async def write_parquet(root: Path, *, rows: bool = True) -> None:
    sink = ParquetSink(str(root))
    await sink.open(SPEC)
    for ids in CHUNKS if rows else ():
        await sink.write(comparison_rows(ids))
    await sink.commit()
    await sink.close()


def iceberg_settings(tmp_path: Path, table: str = "scores") -> IcebergSinkSettings:
    return IcebergSinkSettings(
        catalog_uri=SecretStr(f"sqlite:///{tmp_path}/cat.db"),
        warehouse=f"file://{tmp_path}/wh",
        namespace="ns",
        table=table,
    )


@pytest.fixture
def iceberg(tmp_path: Path) -> Iterator[IcebergSinkSettings]:
    yield iceberg_settings(tmp_path)


async def write_iceberg(settings: IcebergSinkSettings) -> None:
    made: list[LedgerCatalog] = []

    def catalog() -> LedgerCatalog:
        made.append(
            LedgerCatalog(
                settings.catalog_name,
                uri=settings.catalog_uri.get_secret_value(),
                warehouse=settings.warehouse,
            )
        )
        return made[-1]

    sink = IcebergSink(catalog, namespace=settings.namespace)
    try:
        await sink.open(SPEC)
        for ids in CHUNKS:
            await sink.write(comparison_rows(ids))
        await sink.commit()
    finally:
        await sink.close()
        for one in made:
            one.close()


async def stored(kind: str, tmp_path: Path) -> pa.Table:
    """The comparison table written by the ``kind`` sink, read back."""
    if kind == "sqlite":
        await write_sqlite(tmp_path / "results.sqlite")
        return read_comparison(SqliteSinkSettings(path=tmp_path / "results.sqlite"), TABLE)
    if kind == "parquet":
        await write_parquet(tmp_path / TABLE)
        return read_comparison(ParquetSinkSettings(url=str(tmp_path / "scores")), TABLE)
    settings = iceberg_settings(tmp_path)
    await write_iceberg(settings)
    return read_comparison(settings, TABLE)


STORES = ["sqlite", "parquet", "iceberg"]


@pytest.mark.parametrize("kind", STORES)
async def test_every_store_reads_back_what_its_sink_wrote(tmp_path: Path, kind: str) -> None:
    table = (await stored(kind, tmp_path)).sort_by(
        [("chunk_id", "ascending"), ("row_index", "ascending")]
    )
    assert table.num_rows == N
    assert table.column("id").to_pylist() == IDS.tolist()
    assert table.column("chunk_id").to_pylist() == ["c0"] * 50 + ["c1"] * 50
    mine, theirs = production(), candidate()
    failed = np.isin(IDS, list(FAILED))
    for name in ("score", "label"):
        assert table.column(name).to_pylist() == mine[name].tolist()
        want = [
            None if f else v for v, f in zip(theirs[name].tolist(), failed.tolist(), strict=True)
        ]
        assert table.column(f"{name}__candidate").to_pylist() == want
    vectors = table.column("embedding__candidate").to_pylist()
    for i in IDS.tolist():
        if failed[i]:
            assert vectors[i] is None
        else:
            np.testing.assert_array_equal(
                np.array(vectors[i], dtype=np.float32), theirs["embedding"][i]
            )
    assert table.column("candidate_error").to_pylist() == [FAILED.get(i) for i in IDS.tolist()]
    assert table.column("production_version").to_pylist() == ["1"] * 75 + ["3"] * 25
    assert table.column("latency_ms").to_pylist() == (10.0 + IDS).tolist()
    assert set(table.column("model_version").to_pylist()) == {"2"}


@pytest.mark.parametrize("kind", ["sqlite", "parquet"])
async def test_a_table_opened_with_no_rows_reads_empty(tmp_path: Path, kind: str) -> None:
    if kind == "sqlite":
        await write_sqlite(tmp_path / "r.sqlite", rows=False)
        table = read_comparison(SqliteSinkSettings(path=tmp_path / "r.sqlite"), TABLE)
    else:
        await write_parquet(tmp_path / TABLE, rows=False)
        table = read_comparison(ParquetSinkSettings(url=str(tmp_path / "scores")), TABLE)
    assert table.num_rows == 0


async def test_missing_tables_name_the_table_and_the_store(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    with pytest.raises(
        TableMissing,
        match=rf"no table {TABLE} in SQLite database .*results\.sqlite: the database file does not",
    ):
        read_comparison(SqliteSinkSettings(path=path), TABLE)
    await write_sqlite(path)
    with pytest.raises(TableMissing, match=rf"no table other in SQLite database {path}$"):
        read_comparison(SqliteSinkSettings(path=path), "other")
    with pytest.raises(
        TableMissing, match=rf"no table {TABLE} in Parquet dataset {tmp_path}/{TABLE}"
    ):
        read_comparison(ParquetSinkSettings(url=str(tmp_path / "scores")), TABLE)


async def test_iceberg_missing_table_and_empty_catalog(tmp_path: Path) -> None:
    settings = iceberg_settings(tmp_path)
    with pytest.raises(
        TableMissing,
        match=r"no table ns\.scores_candidate in Iceberg catalog rowbatch: the catalog holds no",
    ):
        read_comparison(settings, TABLE)
    await write_iceberg(settings)
    with pytest.raises(TableMissing, match=r"no table ns\.other in Iceberg catalog rowbatch$"):
        read_comparison(settings, "other")


def test_the_parquet_comparison_dataset_is_the_results_sibling(tmp_path: Path) -> None:
    assert parquet_root(str(tmp_path / "scores"), TABLE) == str(tmp_path / TABLE)
    assert parquet_root("s3://lake/out/scores/", TABLE) == f"s3://lake/out/{TABLE}"
    assert parquet_root("s3://lake/scores", TABLE) == f"s3://lake/{TABLE}"
    assert parquet_root("s3://lake/scores", "s3://other/shadow") == "s3://other/shadow"
    with pytest.raises(ValueError, match="bucket's root"):
        parquet_root("s3://lake/", TABLE)


def test_where_names_never_a_password() -> None:
    sink = PostgresSinkSettings(
        dsn=SecretStr("postgresql://u:hunter2@db:6543/rows"), db_schema="ml"
    )
    where = locate(sink, TABLE)
    assert str(where) == f"ml.{TABLE} in PostgreSQL database db:6543/rows"


def test_postgres_types_and_rows_as_arrow() -> None:
    assert pg_arrow_type("real[]") == pa.list_(pa.float32())
    assert pg_arrow_type("bigint") == pa.int64()
    assert pg_arrow_type("double precision") == pa.float64()
    assert pg_arrow_type("numeric") is None
    columns = [("chunk_id", "text"), ("id", "bigint"), ("v", "real[]"), ("x", "numeric")]
    table = pg_table(columns, [("c", 1, [0.5, 1.0], 2), ("c", None, None, 3)])
    assert table.schema.field("v").type == pa.list_(pa.float32())
    assert table.to_pylist() == [
        {"chunk_id": "c", "id": 1, "v": [0.5, 1.0], "x": 2},
        {"chunk_id": "c", "id": None, "v": None, "x": 3},
    ]
    assert pg_table(columns, []).num_rows == 0


KINDS = TableSpec(
    "kinds",
    passthrough=(ColumnSpec("raw", "bytes"), ColumnSpec("flag", "bool")),
    outputs=(
        ColumnSpec("half", "float16"),
        ColumnSpec("small", "uint8"),
        ColumnSpec("mask", "bool", 3),
        ColumnSpec("ints", "int32", 2),
        ColumnSpec("bytes8", "uint8", 2),
        ColumnSpec("wide", "float64", 2),
        ColumnSpec("text", "object"),
    ),
)


def kinds_rows() -> ResultRows:
    n = 3
    null = np.array([False, True, False])
    return ResultRows(
        chunk_id=np.array(["k"] * n, dtype=object),
        row_index=np.arange(n, dtype=np.int64),
        source_message_id=np.array(["m"] * n, dtype=object),
        passthrough={"raw": np.array([b"\x00a", b"", b"z"], dtype=object), "flag": null.copy()},
        outputs={
            "half": np.array([0.5, 1.5, -2.0], dtype=np.float16),
            "small": np.array([0, 255, 7], dtype=np.uint8),
            "mask": np.array([[True, False, True]] * n),
            "ints": np.array([[-1, 2**31 - 1], [0, 0], [5, -6]], dtype=np.int32),
            "bytes8": np.array([[0, 255], [1, 2], [3, 4]], dtype=np.uint8),
            "wide": np.array([[0.1, 0.2], [0.3, 0.4], [1e300, -1e-300]]),
            "text": np.array(["a", None, "c"], dtype=object),
        },
        nulls=dict.fromkeys(("ints", "wide", "text", "raw"), null),
        model_name="m",
        model_version="1",
        processed_at=AT,
    )


@pytest.mark.parametrize("kind", ["sqlite", "parquet"])
async def test_every_dtype_and_null_reads_back(tmp_path: Path, kind: str) -> None:
    sink = (
        SqliteSink(tmp_path / "k.sqlite")
        if kind == "sqlite"
        else ParquetSink(str(tmp_path / "kinds"))
    )
    await sink.open(KINDS)
    await sink.write(kinds_rows())
    if isinstance(sink, ParquetSink):
        await sink.commit()
    await sink.close()
    settings = (
        SqliteSinkSettings(path=tmp_path / "k.sqlite")
        if kind == "sqlite"
        else ParquetSinkSettings(url=str(tmp_path / "results"))
    )
    table = read_comparison(settings, "kinds").sort_by("row_index")
    assert table.column("raw").to_pylist() == [b"\x00a", None, b"z"]
    assert table.column("flag").to_pylist() == [False, True, False]
    assert table.column("half").to_pylist() == [0.5, 1.5, -2.0]
    assert table.column("small").to_pylist() == [0, 255, 7]
    assert table.column("mask").to_pylist() == [[True, False, True]] * 3
    assert table.column("ints").to_pylist() == [[-1, 2**31 - 1], None, [5, -6]]
    assert table.column("bytes8").to_pylist() == [[0, 255], [1, 2], [3, 4]]
    assert table.column("wide").to_pylist() == [[0.1, 0.2], None, [1e300, -1e-300]]
    assert table.column("text").to_pylist() == ["a", None, "c"]
    assert table.schema.field("ints").type.value_type == pa.int32()
    assert table.schema.field("small").type == pa.uint8()


def test_an_unreachable_postgres_fails_without_naming_the_password() -> None:
    dsn = f"postgresql://u:hunter2@127.0.0.1:{free_port()}/rows?connect_timeout=5"
    sink = PostgresSinkSettings(dsn=SecretStr(dsn))
    with pytest.raises(ReadFailed, match=rf"reading public\.{TABLE} in PostgreSQL database") as e:
        read_comparison(sink, TABLE)
    assert "hunter2" not in str(e.value)
