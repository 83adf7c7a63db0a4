"""Error rows (``on_row_error = "error-row"``) in every sink that runs in-process: the result
rows the engine builds for an answered part and an error part land with the outputs null (a
vector output too) and the error columns set on the error rows, null on the others."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.results import ERROR_COLUMNS, Answered, ResultBuilder, error_part
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, TableSpec
from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog
from rowbatch.consumer.sinks.iceberg.sink import IcebergSink
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.dead_letter import ReasonClass

OUTPUTS = (
    ColumnSpec("embedding", "float32", 3),
    ColumnSpec("label", "object"),
    *(ColumnSpec(name, "object") for name in ERROR_COLUMNS),
)
TABLE = TableSpec("results", (ColumnSpec("id", "int64"),), OUTPUTS)
WANT = [
    ("c", 0, 10, [0.0, 1.0, 2.0], "a", None, None),
    ("c", 1, 11, [3.0, 4.0, 5.0], "b", None, None),
    ("c", 2, 12, None, None, "schema-mismatch", "null_not_allowed"),
    ("c", 3, 13, None, None, "schema-mismatch", "null_not_allowed"),
]


def result_rows() -> ResultRows:
    ledger = Ledger()
    entry = ledger.open(Delivery("m", b"", {}, 0.0, 1, "s"), "c", 4, 0, 0.0)
    ids = np.array([10, 11, 12, 13], dtype=np.int64)

    def rows(start: int, stop: int) -> Batch:
        return Batch({"id": ids[start:stop]}, {}, (Segment(entry.key, start, stop),), 0.0)

    answered = Answered(
        rows(0, 2),
        {
            "EMB": np.arange(6, dtype=np.float32).reshape(2, 3),
            "LABEL": np.array(["a", "b"], dtype=object),
        },
    )
    reason = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "row 2 is null", "null_not_allowed")
    builder = ResultBuilder(
        ledger,
        outputs={"EMB": "embedding", "LABEL": "label"},
        passthrough=("id",),
        model_name="m",
        model_version="1",
        wall=lambda: 0.0,
        error_rows=OUTPUTS,
    )
    return builder.build([answered, error_part(rows(2, 4), reason)])


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    names = ["chunk_id", "row_index", "id", "embedding", "label", "error_reason", "error_code"]
    got = [tuple(r[n] for n in names) for r in table.select(names).to_pylist()]
    return sorted(got, key=lambda r: r[1])


async def test_sqlite(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "r.sqlite")
    await sink.open(TABLE)
    assert await sink.write(result_rows()) == 4
    await sink.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "r.sqlite")) as db:
        got = db.execute(
            "SELECT chunk_id, row_index, id, embedding IS NULL, label, error_reason, error_code "
            "FROM results ORDER BY row_index"
        ).fetchall()
    assert got == [(c, r, i, e is None, lab, rea, code) for c, r, i, e, lab, rea, code in WANT]


async def test_parquet(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path / "lake"))
    await sink.open(TABLE)
    await sink.write(result_rows())
    await sink.commit()
    await sink.close()
    files = [str(f) for f in (tmp_path / "lake").glob("processed_date=*/*.parquet")]
    table = ds.dataset(files).to_table()
    assert rows_of(table) == WANT


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Callable[[], LedgerCatalog]]:
    """Catalogs on one SQLite file and warehouse, every one closed at the end."""
    made: list[LedgerCatalog] = []

    def make() -> LedgerCatalog:
        made.append(
            LedgerCatalog(
                "rb", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh"
            )
        )
        return made[-1]

    yield make
    for made_catalog in made:
        made_catalog.close()


async def test_iceberg(catalog: Callable[[], LedgerCatalog]) -> None:
    sink = IcebergSink(catalog, namespace="ns")
    await sink.open(TABLE)
    await sink.write(result_rows())
    await sink.commit()
    await sink.close()
    table = catalog().load_table("ns.results").scan().to_arrow()
    assert rows_of(table) == WANT
