"""One bad row costs one row: the rows the model rejects on their own are dead-lettered as a
row part of their message (a valid chunk of just those rows, keyed by the parent's chunk id and
row indexes), the message's other rows written once and the message acked; a replay of the part
writes its rows under their original keys."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.sinks.base import ResultRows, RowsRejected
from rowbatch.consumer.sources.base import DeadLettersRows
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.row_parts import part_chunk_id
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_CHUNK_ID, H_PARENT_ROWS
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    double,
    make,
    message,
    poison_if_negative,
)


class RowsSource(FakeSource):
    """A source that publishes row parts (``DeadLettersRows``); ``fail_publish``: each
    publish raises."""

    def __init__(self, deliveries: Sequence[Delivery], *, fail_publish: bool = False) -> None:
        super().__init__(deliveries)
        self.parts: list[tuple[str, bytes, dict[str, str], DeadLetterReason]] = []
        self._fail = fail_publish

    @property
    def dead_letters_rows(self) -> bool:
        return True

    async def dead_letter_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None:
        if self._fail:
            raise RuntimeError("dead-letter topic unreachable")
        self.parts.append((delivery.message_id, payload, dict(attributes), reason))


def counting(run: object) -> tuple[list[int], object]:
    calls: list[int] = []

    async def counted(batch: Batch) -> object:
        calls.append(len(batch))
        return await run(batch)  # type: ignore[operator]

    return calls, counted


def test_the_fake_is_a_rows_dead_letterer() -> None:
    assert isinstance(RowsSource([]), DeadLettersRows)
    assert not isinstance(FakeSource([]), DeadLettersRows)


async def test_one_bad_row_costs_one_row_and_its_siblings_are_written_once() -> None:
    values = [float(v) for v in range(10)]
    values[3] = -1.0
    deliveries = [message(0, [1.0, 2.0]), message(1, values), message(2, [7.0])]
    source, sink = RowsSource(deliveries), FakeSink()
    calls, run = counting(poison_if_negative(double))
    await asyncio.wait_for(make(source, sink, run).run(asyncio.Event()), 10)  # type: ignore[arg-type]
    assert sorted(source.acked) == ["m0", "m1", "m2"]
    assert source.dead == []  # no message dead-lettered whole
    assert not source.nacked
    [(mid, payload, attributes, reason)] = source.parts
    assert mid == "m1"
    assert reason.reason_class.value == "rejected-by-model"
    assert attributes[H_PARENT_CHUNK_ID] == "chunk-1"
    assert attributes[H_PARENT_ROWS] == "3"
    assert attributes[H_CHUNK_ID] == part_chunk_id("chunk-1", [3])
    part = decode_chunk(payload, attributes)
    assert part.row_count == 1
    assert part.columns["x"].tolist() == [-1.0]
    want = {("chunk-1", r): v * 2 for r, v in enumerate(values) if r != 3}
    assert {k: v for k, v in sink.rows.items() if k[0] == "chunk-1"} == want
    assert sink.deleted == []
    # Bounded: the batches of a run without the bad row, plus the isolation's requests.
    assert len(calls) <= 6 + 1 + 2 * 1 * 4 + 1 + 1


async def test_bad_rows_of_one_reason_make_one_part_and_a_redelivery_makes_the_same() -> None:
    values = [1.0, -2.0, 3.0, 4.0, -5.0, 6.0]
    parts = []
    for attempt in (1, 2):
        source, sink = RowsSource([message(1, values)]), FakeSink()
        await asyncio.wait_for(
            make(source, sink, poison_if_negative(double)).run(asyncio.Event()), 10
        )
        [(_, payload, attributes, _)] = source.parts
        assert attributes[H_PARENT_ROWS] == "1,4", attempt
        assert decode_chunk(payload, attributes).columns["x"].tolist() == [-2.0, -5.0]
        parts.append(attributes[H_CHUNK_ID])
        assert source.acked == ["m1"]
        assert set(sink.rows) == {("chunk-1", r) for r in (0, 2, 3, 5)}
    assert parts[0] == parts[1]  # the same rows of the same chunk: the same part


async def test_a_replayed_part_writes_its_rows_under_their_original_keys() -> None:
    values = [1.0, -2.0, 3.0, -4.0]
    source, sink = RowsSource([message(1, values)]), FakeSink()
    await asyncio.wait_for(make(source, sink, poison_if_negative(double)).run(asyncio.Event()), 10)
    [(_, payload, attributes, _)] = source.parts
    # Fixed upstream (here: a model that takes negative values), the part replayed.
    replayed = Delivery("r1", payload, attributes, 0.0, 1, "sub")
    again = RowsSource([replayed])
    await asyncio.wait_for(make(again, sink, double).run(asyncio.Event()), 10)
    assert again.acked == ["r1"]
    assert sink.rows == {("chunk-1", r): v * 2 for r, v in enumerate(values)}


async def test_a_part_that_is_not_confirmed_nacks_the_message() -> None:
    source, sink = RowsSource([message(1, [1.0, -2.0, 3.0])], fail_publish=True), FakeSink()
    await asyncio.wait_for(make(source, sink, poison_if_negative(double)).run(asyncio.Event()), 10)
    assert source.nacked == ["m1"]
    assert source.acked == []
    # Its good rows stay written: the redelivery writes them again under the same keys.
    assert set(sink.rows) == {("chunk-1", 0), ("chunk-1", 2)}


async def test_a_one_row_message_is_dead_lettered_whole_as_before() -> None:
    source, sink = RowsSource([message(1, [-1.0]), message(2, [2.0])]), FakeSink()
    await asyncio.wait_for(make(source, sink, poison_if_negative(double)).run(asyncio.Event()), 10)
    assert [mid for mid, _ in source.dead] == ["m1"]
    assert source.parts == []
    assert source.acked == ["m2"]


@pytest.mark.parametrize(
    ("header", "value"),
    [(H_PARENT_ROWS, "0,0"), (H_PARENT_ROWS, "1-0"), (H_PARENT_ROWS, "x"), (H_PARENT_ROWS, "0")],
)
async def test_a_part_whose_keys_do_not_fit_is_undecodable(header: str, value: str) -> None:
    enc = message(1, [1.0, 2.0])
    attributes = {**enc.attributes, H_PARENT_CHUNK_ID: "chunk-0", header: value}
    source, sink = RowsSource([Delivery("p", enc.payload, attributes, 0.0, 1, "sub")]), FakeSink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), 10)
    [(mid, reason)] = source.dead
    assert (mid, reason.reason_class.value) == ("p", "undecodable")
    assert H_PARENT_ROWS in reason.message
    assert sink.rows == {}


def test_wire_error_names_the_header() -> None:
    from rowbatch.wire.chunks.row_parts import parse_rows

    with pytest.raises(WireError, match=H_PARENT_ROWS):
        parse_rows("3,2", 2)
    assert parse_rows("0-2,7", 4).tolist() == [0, 1, 2, 7]
    assert np.array_equal(parse_rows("5", 1), [5])


class PickySink(FakeSink):
    """Rejects any write holding a row whose input was 13 (as a database refuses a value)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def write(self, rows: ResultRows) -> int:
        self.attempts += 1
        if (np.asarray(rows.outputs["y"]) == 26).any():
            raise RowsRejected("value 13 refused by a CHECK constraint", code="check_violation")
        return await super().write(rows)


async def test_rows_the_sink_rejects_cost_their_rows_only() -> None:
    values = [float(v) for v in range(12)]
    values[5] = values[9] = 13.0
    source, sink = RowsSource([message(0, [1.0, 2.0]), message(1, values)]), PickySink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), 10)
    assert sorted(source.acked) == ["m0", "m1"]
    assert source.dead == []
    [(mid, payload, attributes, reason)] = source.parts
    assert (mid, reason.reason_class.value, reason.code) == (
        "m1",
        "rejected-by-sink",
        "check_violation",
    )
    assert attributes[H_PARENT_ROWS] == "5,9"
    assert decode_chunk(payload, attributes).columns["x"].tolist() == [13.0, 13.0]
    want = {("chunk-1", r): v * 2 for r, v in enumerate(values) if r not in (5, 9)}
    assert {k: v for k, v in sink.rows.items() if k[0] == "chunk-1"} == want


async def test_without_row_dead_letters_the_sink_rejects_the_message_whole() -> None:
    values = [1.0, 13.0, 3.0]
    source, sink = FakeSource([message(1, values), message(2, [4.0])]), PickySink()
    await asyncio.wait_for(make(source, sink).run(asyncio.Event()), 10)
    assert [(mid, r.reason_class.value) for mid, r in source.dead] == [("m1", "rejected-by-sink")]
    assert source.acked == ["m2"]
    assert not any(k[0] == "chunk-1" for k in sink.rows)
