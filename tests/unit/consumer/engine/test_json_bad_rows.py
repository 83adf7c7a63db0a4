"""A JSON message whose decode fails in some rows only (a vector row of the wrong length, a null
element in a vector) costs those rows: they are dead-lettered as a row part holding their
values as sent (the part itself does not decode, as its parent did not), the message's other
rows are decoded, checked, sent and written once under their own keys. Error rows cannot carry
rows that do not decode: those still go as a row part (or, where the source cannot publish one,
with their whole message)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.decode import MessageDecoder, PoisonMessage, PoisonRows
from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ColumnSpec
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.chunks.json_rows import json_rows, with_rows
from rowbatch.wire.chunks.row_parts import part_chunk_id, row_part
from rowbatch.wire.errors import ColumnTypeMismatch
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_CHUNK_ID, H_PARENT_ROWS, H_ROW_COUNT
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, FnModel, Rejected
from tests.unit.consumer.engine.test_row_isolation import RowsSource

DIM = 3


def vectors_message(i: int, rows: list[Any], ids: list[Any] | None = None) -> Delivery:
    """A JSON chunk of ``rows`` (lists of floats, written as given, even of the wrong length),
    with an ``id`` column, as a producer that bypasses the encoder's checks could send it."""
    n = len(rows)
    good = encode_chunk(
        "t",
        {"x": np.zeros((n, DIM), np.float32), "id": np.arange(n, dtype=np.int64)},
        "json",
        f"chunk-{i}",
    )
    doc = json.loads(good.payload)
    for entry in doc["columns"]:
        if entry["name"] == "x":
            entry["values"] = rows
        elif ids is not None:
            entry["values"] = ids
    return Delivery(f"m{i}", json.dumps(doc).encode(), good.attributes, 0.0, 1, "sub")


def no_check(_chunk: Any) -> None:
    pass


async def total(batch: Batch) -> Mapping[str, NDArray[Any]]:
    return {"Y": np.asarray(batch.columns["x"]).sum(axis=1).astype(np.float64)}


ROWS: list[Any] = [[1, 1, 1], [2, 2, 2], [3, 3], [4, 4, 4], [5, None, 5], [6, 6, 6]]


def test_json_rows_keep_values_as_sent() -> None:
    payload = json.dumps(
        {"columns": [{"name": "a", "type": "int64", "values": [2**70, 1, 2]},
                     {"name": "b", "type": "string", "values": ["é\ud800", None, "x"]}]}
    ).encode()  # fmt: skip
    doc = json.loads(json_rows(payload, [2, 0]))
    assert doc["columns"][0]["values"] == [2, 2**70]
    assert doc["columns"][1]["values"] == ["x", "é\ud800"]


def test_the_rows_that_do_not_decode_are_set_apart_naming_their_rows() -> None:
    d = vectors_message(1, ROWS)
    with pytest.raises(ColumnTypeMismatch):
        decode_chunk(d.payload, d.attributes)
    with pytest.raises(PoisonRows) as caught:
        MessageDecoder(("x", "id"), no_check).rows(d)
    split = caught.value
    assert [row for row, _ in split.failed] == [2, 4]
    (_, short), (_, null) = split.failed
    assert short.reason_class.value == "undecodable"
    assert short.code == "column_type_mismatch" and "row 2 has 2 elements" in short.message
    assert null.code == "invalid_value" and "row 4" in null.message
    assert split.bad is None  # nothing of them to write
    kept = split.kept
    assert kept.rows == 4 and kept.chunk_id == "chunk-1"
    assert kept.row_keys is not None and kept.row_keys.tolist() == [0, 1, 3, 5]
    assert kept.columns["x"][:, 0].tolist() == [1.0, 2.0, 4.0, 6.0]


def test_a_failure_of_the_whole_payload_stays_the_messages() -> None:
    d = vectors_message(1, [[1, 1], [2, 2]])  # every row of the wrong length
    with pytest.raises(PoisonMessage) as caught:
        MessageDecoder(("x",), no_check).rows(d)
    assert not isinstance(caught.value, PoisonRows)
    assert caught.value.reason.code == "column_type_mismatch"


def test_a_failure_taking_the_rows_apart_makes_the_whole_message_poison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kept rows decoded again fail (they should not: each half decoded alone): the
    message goes whole as poison, never as a plain exception that would end intake."""
    import rowbatch.consumer.engine.decode as decode_module

    kept_decodes = 0

    def failing_kept(payload: bytes, attributes: Mapping[str, str]) -> Any:
        nonlocal kept_decodes
        if attributes[H_ROW_COUNT] == "4":  # the 4 kept rows (no half of 6 has 4)
            kept_decodes += 1
            raise ColumnTypeMismatch("column x: a row of 2 elements")
        return decode_chunk(payload, attributes)

    monkeypatch.setattr(decode_module, "decode_chunk", failing_kept)
    with pytest.raises(PoisonMessage) as caught:
        MessageDecoder(("x", "id"), no_check).rows(vectors_message(1, ROWS))
    assert not isinstance(caught.value, PoisonRows)
    assert caught.value.reason.reason_class.value == "undecodable"
    assert kept_decodes == 1


def test_a_part_of_rows_that_do_not_decode_holds_them_as_sent() -> None:
    d = vectors_message(1, ROWS)
    payload, attributes = row_part(d.payload, d.attributes, [2, 4])
    assert attributes[H_PARENT_CHUNK_ID] == "chunk-1"
    assert attributes[H_PARENT_ROWS] == "2,4"
    assert attributes[H_ROW_COUNT] == "2"
    assert attributes[H_CHUNK_ID] == part_chunk_id("chunk-1", [2, 4])
    columns = {c["name"]: c["values"] for c in json.loads(payload)["columns"]}
    assert columns == {"x": [[3, 3], [5, None, 5]], "id": [2, 4]}
    # Fixed upstream, the part decodes and its rows land under the parent's keys.
    fixed = json.loads(payload)
    fixed["columns"][0]["values"] = [[3, 3, 3], [5, 5, 5]]
    chunk = decode_chunk(json.dumps(fixed).encode(), with_rows(attributes, 2))
    assert chunk.columns["x"].tolist() == [[3, 3, 3], [5, 5, 5]]


async def run(source: FakeSource, sink: FakeSink, **settings: Any) -> None:
    pipeline = make_pipeline(
        source,
        sink,
        FnModel(total, poison=Rejected),
        metrics=Metrics(),
        decoder=MessageDecoder(("x", "id"), no_check),
        target_batch_size=4,
        max_in_flight=2,
        max_wait_s=0.0,
        **settings,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)


async def test_the_other_rows_are_written_once_and_the_bad_ones_dead_lettered_as_sent() -> None:
    source, sink = RowsSource([vectors_message(1, ROWS)]), FakeSink()
    await run(source, sink)
    assert source.acked == ["m1"] and source.dead == []
    assert sink.rows == {("chunk-1", r): 3.0 * (r + 1) for r in (0, 1, 3, 5)}
    parts = {attrs[H_PARENT_ROWS]: (payload, reason) for _, payload, attrs, reason in source.parts}
    assert set(parts) == {"2", "4"}  # one part per reason code
    assert parts["2"][1].code == "column_type_mismatch"
    assert parts["4"][1].code == "invalid_value"
    values = json.loads(parts["4"][0])["columns"][0]["values"]
    assert values == [[5, None, 5]]


@pytest.mark.parametrize("rows_apart", [True, False])
async def test_with_error_rows_rows_that_do_not_decode_still_go_as_a_part(
    rows_apart: bool,
) -> None:
    error_rows = (ColumnSpec("y", "float64"), *(ColumnSpec(n, "object") for n in ERROR_COLUMNS))
    d = vectors_message(1, ROWS)
    source = RowsSource([d]) if rows_apart else FakeSource([d])
    sink = FakeSink()
    await run(source, sink, error_rows=error_rows)
    if isinstance(source, RowsSource):
        assert rows_apart
        assert source.acked == ["m1"] and source.dead == []
        assert {a[H_PARENT_ROWS] for _, _, a, _ in source.parts} == {"2", "4"}
        assert set(sink.rows) == {("chunk-1", r) for r in (0, 1, 3, 5)}
    else:  # nothing can carry the rows that do not decode: the message goes whole
        assert [(mid, reason.code) for mid, reason in source.dead] == [
            ("m1", "column_type_mismatch")
        ]
        assert sink.rows == {}
