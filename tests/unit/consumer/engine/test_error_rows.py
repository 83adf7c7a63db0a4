"""``[sink] on_row_error = "error-row"``: a row that fails on its own (the model rejects it,
its values fail the model's input checks) is written to the result table with null outputs and
the error columns (reason, code, words), never mixed silently with results: its siblings are
written as usual, the message acked, nothing dead-lettered; rows the sink refuses are still
dead-lettered (an error row of theirs could be refused again)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from rowbatch.consumer.engine.decode import MessageDecoder
from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, RowsRejected, TableSpec
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.headers.fields import H_PARENT_ROWS
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_bad_rows_intake import CHECK, delivery, negative_rejected
from tests.unit.consumer.engine.test_pipeline import FakeSource, FnModel, Rejected, message
from tests.unit.consumer.engine.test_row_isolation import RowsSource
from tests.unit.consumer.engine.test_rows_failed import TOO_LONG, RowByRowModel, too_long

OUTPUTS = (ColumnSpec("y", "int64"), *(ColumnSpec(name, "object") for name in ERROR_COLUMNS))


class RecordingSink:
    """Every row written, by key: its ``y`` (None where null) and its error columns."""

    def __init__(self, cast: Any = int) -> None:
        self.rows: dict[tuple[str, int], tuple[Any, ...]] = {}
        self._cast = cast

    async def open(self, table: TableSpec) -> None:
        pass

    async def write(self, rows: ResultRows) -> int:
        columns = ("y", *ERROR_COLUMNS)
        for i, (cid, idx) in enumerate(zip(rows.chunk_id, rows.row_index, strict=True)):
            values = []
            for name in columns:
                mask = rows.nulls.get(name)
                null = mask is not None and bool(mask[i])
                value = rows.outputs[name][i]
                values.append(None if null else self._cast(value) if name == "y" else value)
            self.rows.setdefault((str(cid), int(idx)), tuple(values))
        return len(rows)

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        raise AssertionError("nothing is dead-lettered whole")

    async def close(self) -> None:
        pass


async def run(source: FakeSource, sink: Any, metrics: Metrics | None = None) -> None:
    pipeline = make_pipeline(
        source,
        sink,
        FnModel(negative_rejected, poison=Rejected),
        metrics=metrics or Metrics(),
        decoder=MessageDecoder(("x",), CHECK),
        target_batch_size=4,
        max_in_flight=2,
        max_wait_s=0.0,
        error_rows=OUTPUTS,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)


async def test_rows_failing_alone_are_written_as_error_rows_beside_their_siblings() -> None:
    values = [0, 1, 2, -3, 4, 5, 6, 7, 8, 9]
    # A source that cannot dead-letter rows: error rows need no dead letter.
    source = FakeSource([delivery(1, values, nulls=[6]), delivery(2, [-5])])
    sink, metrics = RecordingSink(), Metrics()
    await run(source, sink, metrics)
    assert sorted(source.acked) == ["m1", "m2"]
    assert source.dead == [] and not source.nacked
    rejected = sink.rows.pop(("chunk-1", 3))
    assert rejected[:3] == (None, "rejected-by-model", "invalid_argument")
    assert "negative" in rejected[3]
    null = sink.rows.pop(("chunk-1", 6))
    assert null[:3] == (None, "schema-mismatch", "null_not_allowed")
    assert "row 6 is null" in null[3]
    alone = sink.rows.pop(("chunk-2", 0))  # a one-row message: an error row, not a dead letter
    assert alone[:2] == (None, "rejected-by-model")
    want = {("chunk-1", r): (v * 2, None, None, None) for r, v in enumerate(values)}
    del want[("chunk-1", 3)], want[("chunk-1", 6)]
    assert sink.rows == want
    assert (
        metrics.registry.get_sample_value(
            "rowbatch_rows_errored_total", {"reason": "rejected-by-model"}
        )
        == 2
    )
    assert (
        metrics.registry.get_sample_value(
            "rowbatch_rows_errored_total", {"reason": "schema-mismatch"}
        )
        == 1
    )


async def test_error_rows_land_in_sqlite_with_null_outputs(tmp_path: Path) -> None:
    sink = SqliteSink(tmp_path / "r.sqlite")
    await sink.open(TableSpec("results", (), OUTPUTS))
    source = FakeSource([delivery(1, [1, -2, 3], nulls=[2]), delivery(2, [4, 5])])
    try:
        await run(source, sink)
    finally:
        await sink.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "r.sqlite")) as db:
        got = db.execute(
            "SELECT chunk_id, row_index, y, error_reason, error_code FROM results "
            "ORDER BY chunk_id, row_index"
        ).fetchall()
    assert got == [
        ("chunk-1", 0, 2, None, None),
        ("chunk-1", 1, None, "rejected-by-model", "invalid_argument"),
        ("chunk-1", 2, None, "schema-mismatch", "null_not_allowed"),
        ("chunk-2", 0, 8, None, None),
        ("chunk-2", 1, 10, None, None),
    ]
    assert sorted(source.acked) == ["m1", "m2"] and source.dead == []


async def test_a_replayed_delivery_writes_no_error_row_twice() -> None:
    sink = RecordingSink()
    d = delivery(1, [1, -2, 3, 4, 5])
    await run(FakeSource([d]), sink)
    first = dict(sink.rows)
    redelivered = Delivery("m1b", d.payload, d.attributes, 0.0, 2, "sub")
    await run(FakeSource([redelivered]), sink)
    assert sink.rows == first and len(first) == 5
    assert np.array_equal(sorted(k[1] for k in first), np.arange(5))


async def test_rows_an_openai_compatible_server_refuses_become_error_rows() -> None:
    # Rows answered 400 alone (RowsFailed): no request is sent again, the rows become error
    # rows with the server's words, in a message spanning two batches too.
    values = [1.0, -1.0, 2.0, 3.0, 4.0, -2.0]
    model = RowByRowModel({-1.0: too_long(-1), -2.0: too_long(-2)}, target=4)
    source = FakeSource([message(1, values)])
    sink = RecordingSink(cast=float)
    pipeline = make_pipeline(
        source,
        sink,
        model,
        metrics=Metrics(),
        target_batch_size=4,
        max_in_flight=2,
        max_wait_s=0.0,
        error_rows=(ColumnSpec("y", "float64"), *OUTPUTS[1:]),
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)
    assert source.acked == ["m1"] and source.dead == []
    assert len(model.calls) == 2  # the two batches, nothing sent again
    for row in (1, 5):
        y, reason, code, words = sink.rows[("chunk-1", row)]
        assert (y, reason, code) == (None, "rejected-by-model", TOO_LONG)
        assert "maximum context length" in words
    assert [sink.rows[("chunk-1", r)][0] for r in (0, 2, 3, 4)] == [2.0, 4.0, 6.0, 8.0]


class PickyRecordingSink(RecordingSink):
    """Refuses any write holding a result of 26 (input 13), as a CHECK constraint would."""

    async def write(self, rows: ResultRows) -> int:
        y = np.asarray(rows.outputs["y"])
        null = rows.nulls.get("y")
        valued = np.ones(len(y), np.bool_) if null is None else ~np.asarray(null)
        if ((y == 26) & valued).any():
            raise RowsRejected("value 13 refused by a CHECK constraint", code="check_violation")
        return await super().write(rows)


async def test_a_row_the_sink_refuses_beside_an_error_row_is_dead_lettered_as_itself() -> None:
    """Row 1 fails the input checks (an error row, queued after the others) and row 2 is
    refused by the sink: the row part names row 2 of the message, not the queued position
    it had (1), which is the error row's."""
    source, sink = RowsSource([delivery(1, [1, 0, 13, 4], nulls=[1])]), PickyRecordingSink()
    await run(source, sink)
    assert source.acked == ["m1"]
    [(mid, _, attributes, reason)] = source.parts
    assert (mid, reason.code) == ("m1", "check_violation")
    assert attributes[H_PARENT_ROWS] == "2"
    assert sink.rows[("chunk-1", 1)][:2] == (None, "schema-mismatch")
    assert {k: v[0] for k, v in sink.rows.items() if k != ("chunk-1", 1)} == {
        ("chunk-1", 0): 2,
        ("chunk-1", 3): 8,
    }
