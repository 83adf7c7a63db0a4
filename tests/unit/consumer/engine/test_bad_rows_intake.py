"""Rows failing the binding's value checks on their own (a null where the model takes none, a
value out of the input's range) cost their rows, not their message: they are dead-lettered as a
row part with the check's own reason, the message's other rows go to the model and are written
once under their own keys, and the message is acked. A failure that is not a row's (a missing
column) and a source that cannot dead-letter rows keep the whole message as the poison."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.bad_rows import find_bad_rows
from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.decode import MessageDecoder
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.chunk_check import check_chunk, memoized_check
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ColumnSpec
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.chunks.row_parts import part_chunk_id, row_part
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_ROWS
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, FnModel, Rejected
from tests.unit.consumer.engine.test_row_isolation import RowsSource

SPEC = ModelSpec("m", "1", (TensorSpec("X", "INT32", (1,)),), (TensorSpec("Y", "INT32", (1,)),), 8)
BINDING = Binding({"x": "X"}, {"Y": "y"}, ())
TOO_BIG = 2**40


def _full(chunk: DecodedChunk) -> None:
    check_chunk(SPEC, BINDING, {name: chunk.column(name) for name in chunk.columns})


CHECK = memoized_check(SPEC, BINDING, _full)


def delivery(i: int, values: list[int], nulls: list[int] = ()) -> Delivery:  # type: ignore[assignment]
    mask = np.zeros(len(values), dtype=np.bool_)
    mask[list(nulls)] = True
    enc = encode_chunk(
        "t", {"x": np.array(values, np.int64)}, "json", f"chunk-{i}", null_masks={"x": mask}
    )
    return Delivery(f"m{i}", enc.payload, enc.attributes, 0.0, 1, "sub")


async def double(batch: Batch) -> Mapping[str, NDArray[Any]]:
    x = np.asarray(batch.columns["x"])
    assert "x" not in batch.nulls or not np.asarray(batch.nulls["x"]).any(), "a null reached it"
    assert (np.abs(x) < 2**31).all(), "a value out of range reached the model"
    return {"Y": x * 2}


def negative_rejected(batch: Batch) -> Any:
    async def run(b: Batch) -> Mapping[str, NDArray[Any]]:
        if (np.asarray(b.columns["x"]) < 0).any():
            raise Rejected("negative value")
        return await double(b)

    return run(batch)


async def run_pipeline(
    source: FakeSource, sink: FakeSink, run: Any = double, **settings: Any
) -> None:
    pipeline = make_pipeline(
        source,
        sink,
        FnModel(run, poison=Rejected),
        metrics=Metrics(),
        decoder=MessageDecoder(("x",), CHECK),
        target_batch_size=4,
        max_in_flight=2,
        max_wait_s=0.0,
        **settings,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)


def test_the_bad_rows_are_found_with_the_checks_own_words_naming_their_row() -> None:
    d = delivery(1, [1, 2, 3, TOO_BIG, 5, 6, 7, 8, 9], nulls=[6])
    chunk = decode_chunk(d.payload, d.attributes)
    found = find_bad_rows(CHECK, chunk)
    assert found is not None
    assert [row for row, _ in found] == [3, 6]
    (_, big), (_, null) = found
    assert big.code == "invalid_value" and "row 3" in big.message and big.row == 3
    assert null.code == "null_not_allowed" and "row 6 is null" in null.message


def test_every_row_bad_or_a_failure_that_is_not_a_rows_is_the_messages() -> None:
    d = delivery(1, [1, 2], nulls=[0, 1])
    assert find_bad_rows(CHECK, decode_chunk(d.payload, d.attributes)) is None
    enc = encode_chunk("t", {"z": np.array([1, 2], np.int64)}, "json", "c")
    assert find_bad_rows(CHECK, decode_chunk(enc.payload, enc.attributes)) is None


async def test_rows_failing_the_checks_cost_their_rows_and_the_others_are_written_once() -> None:
    values = [10, 11, 12, 13, 14, 15, TOO_BIG, 17, 18, 19]
    source, sink = RowsSource([delivery(0, [1, 2]), delivery(1, values, nulls=[2])]), FakeSink()
    await run_pipeline(source, sink)
    assert sorted(source.acked) == ["m0", "m1"]
    assert source.dead == [] and not source.nacked
    parts = {
        attrs[H_PARENT_ROWS]: (payload, attrs, reason) for _, payload, attrs, reason in source.parts
    }
    assert set(parts) == {"2", "6"}  # one part per reason
    _, null_attrs, null_reason = parts["2"]
    assert null_reason.reason_class.value == "schema-mismatch"
    assert null_reason.code == "null_not_allowed"
    assert null_attrs[H_CHUNK_ID] == part_chunk_id("chunk-1", [2])
    big_payload, big_attrs, big_reason = parts["6"]
    assert big_reason.code == "invalid_value" and "row 6" in big_reason.message
    assert decode_chunk(big_payload, big_attrs).columns["x"].tolist() == [TOO_BIG]
    want = {("chunk-1", r): v * 2 for r, v in enumerate(values) if r not in (2, 6)}
    want |= {("chunk-0", 0): 2, ("chunk-0", 1): 4}
    assert sink.rows == want


async def test_a_row_the_model_rejects_beside_one_the_checks_set_apart_keeps_its_index() -> None:
    # Row 1 fails the checks at intake; row 4 (queued as the 4th row) is rejected by the model:
    # its part must name row 4 of the message, not the queue's index 3.
    values = [0, 1, 2, 3, -4, 5]
    source, sink = RowsSource([delivery(1, values, nulls=[1])]), FakeSink()
    await run_pipeline(source, sink, negative_rejected)
    assert source.acked == ["m1"] and source.dead == []
    rows = {attrs[H_PARENT_ROWS]: reason.reason_class.value for _, _, attrs, reason in source.parts}
    assert rows == {"1": "schema-mismatch", "4": "rejected-by-model"}
    assert set(sink.rows) == {("chunk-1", r) for r in (0, 2, 3, 5)}


async def test_a_replayed_part_still_bad_in_a_row_keeps_the_parents_keys() -> None:
    parent = delivery(1, [10, 11, 12, 13, 14, 15], nulls=[3])
    payload, attributes = row_part(parent.payload, parent.attributes, [1, 3, 5])
    source = RowsSource([Delivery("p", payload, attributes, 0.0, 1, "sub")])
    sink = FakeSink()
    await run_pipeline(source, sink)
    assert set(sink.rows) == {("chunk-1", 1), ("chunk-1", 5)}
    [(_, _, attrs, _)] = source.parts
    assert attrs[H_PARENT_ROWS] == "3"
    assert attrs[H_CHUNK_ID] == part_chunk_id("chunk-1", [3])


@pytest.mark.parametrize("rows_apart", [True, False])
async def test_where_rows_cannot_go_apart_or_the_column_is_missing_the_message_is_poison(
    rows_apart: bool,
) -> None:
    missing = encode_chunk("t", {"z": np.array([1, 2], np.int64)}, "json", "chunk-2")
    deliveries = [
        delivery(1, [1, 2, 3], nulls=[1]),
        Delivery("m2", missing.payload, missing.attributes, 0.0, 1, "sub"),
    ]
    source = RowsSource(deliveries) if rows_apart else FakeSource(deliveries)
    sink = FakeSink()
    await run_pipeline(source, sink)
    dead = {mid: reason.code for mid, reason in source.dead}
    if rows_apart:
        assert dead == {"m2": "missing_column"}
        assert sink.rows == {("chunk-1", 0): 2, ("chunk-1", 2): 6}
    else:
        assert dead == {"m1": "null_not_allowed", "m2": "missing_column"}
        assert sink.rows == {}


def test_queued_rows_map_to_runs_of_the_message() -> None:
    ledger = Ledger()
    d = delivery(1, [1, 2, 3, 4, 5, 6])
    entry = ledger.open(
        d,
        "chunk-1",
        6,
        0,
        0.0,
        failed_rows=((2, object()),),  # type: ignore[arg-type]
        positions=np.array([0, 1, 3, 4, 5], dtype=np.int64),
    )
    assert entry.unresolved == 5
    assert entry.in_message(0, 5) == [(0, 2), (3, 6)]
    assert entry.in_message(1, 3) == [(1, 2), (3, 4)]


@pytest.mark.parametrize("error_rows", [False, True])
async def test_a_table_mode_part_of_a_chunk_keeps_its_offset(error_rows: bool) -> None:
    # A table-mode delivery of rows 100.. of its chunk (a restart's leftover): the rows kept
    # beside one set apart at intake are written under 100 + their index, as any of its rows.
    d = delivery(1, [1, 2, 3, 4], nulls=[1])
    offset = Delivery.of_rows(
        message_id="m1",
        payload=d.payload,
        attributes=d.attributes,
        publish_time=0.0,
        delivery_attempt=1,
        source="file",
        size=0,
        row_offset=100,
    )
    source, sink = RowsSource([offset]), FakeSink()
    settings: dict[str, Any] = {}
    if error_rows:
        settings["error_rows"] = (
            ColumnSpec("y", "float64"),
            *(ColumnSpec(n, "object") for n in ERROR_COLUMNS),
        )
    await run_pipeline(source, sink, **settings)
    want = {("chunk-1", 100 + r) for r in ((0, 1, 2, 3) if error_rows else (0, 2, 3))}
    assert set(sink.rows) == want


def test_many_nulls_cost_one_check_a_column_not_a_bisection() -> None:
    # A 10,000-row table chunk whose input column is null in half its rows: the nulls are set
    # apart in one go (a bisection would take ~140,000 checks), the out-of-range row bisected.
    n = 10_000
    values = list(range(n))
    values[7] = TOO_BIG
    nulls = [r for r in range(n) if r % 2 and r != 7]
    d = delivery(1, values, nulls=nulls)
    chunk = decode_chunk(d.payload, d.attributes)
    calls: list[int] = []

    def counted(c: DecodedChunk) -> None:
        calls.append(c.row_count)
        CHECK(c)

    found = find_bad_rows(counted, chunk)
    assert found is not None
    assert [row for row, _ in found] == sorted([*nulls, 7])
    assert {error.code for row, error in found if row != 7} == {"null_not_allowed"}
    assert dict(found)[7].code == "invalid_value"
    assert "row 9 is null" in dict(found)[9].message
    assert len(calls) <= 2 + 2 * 13  # the nulls' check, then one row bisected among 5,001
