"""A model handler that answers a batch row by row (the OpenAI-compatible one) and raises
``RowsFailed`` for the rows that failed on their own: those rows are dead-lettered as row parts
of their messages (with the handler's code and words), every other row is written once, each
message acked once, and no request is sent again (no bisection). A source that cannot
dead-letter rows dead-letters the message holding a failed row whole instead."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.sinks.base import ResultRows
from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.timing import Clocks
from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.row_parts import parse_rows, part_chunk_id
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_CHUNK_ID, H_PARENT_ROWS
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, message
from tests.unit.consumer.engine.test_row_isolation import RowsSource

TOO_LONG = "prompt_too_long"
UNPARSEABLE = "unparseable_output"


class Crash(Exception):
    """A request the server failed for good (a 500)."""


class RowByRowModel:
    """A model handler answering ``Y = 2 x`` row by row: a row whose ``x`` is in ``errors``
    fails on its own with that error (the batch raises ``RowsFailed``, every row's outputs in
    its answer); a batch holding a value of ``crash`` raises :class:`Crash` (fatal)."""

    def __init__(
        self,
        errors: Mapping[float, RowError],
        *,
        target: int,
        crash: frozenset[float] = frozenset(),
    ) -> None:
        self.errors = dict(errors)
        self.crash = crash
        self.target_batch_size = target
        self.output_bytes_per_row = 8
        self.calls: list[list[float]] = []

    def check(self, chunk: DecodedChunk) -> None:
        pass

    async def run(self, batch: BatchRows) -> Answer:
        x: NDArray[np.float64] = np.asarray(batch.columns["x"], np.float64)
        values = [float(v) for v in x.tolist()]
        self.calls.append(values)
        if self.crash & set(values):
            raise Crash("HTTP 500")
        answer = Answer({"Y": x * 2}, "7")
        failed = {row: self.errors[v] for row, v in enumerate(values) if v in self.errors}
        if failed:
            raise RowsFailed(answer, failed)
        return answer

    def is_poison(self, exc: BaseException) -> bool:
        return False  # this handler fails rows itself: nothing it raises is poison

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, Crash)


class CountingSink(FakeSink):
    """Counts how often each row is written."""

    def __init__(self) -> None:
        super().__init__()
        self.times: Counter[tuple[str, int]] = Counter()

    async def write(self, rows: ResultRows) -> int:
        for cid, idx in zip(rows.chunk_id, rows.row_index, strict=True):
            self.times[(str(cid), int(idx))] += 1
        return await super().write(rows)


def pipeline(source: FakeSource, sink: FakeSink, model: RowByRowModel) -> Pipeline:
    """Batches of exactly ``model.target_batch_size`` rows (the rest when intake ends): the
    clock never reaches the latency bound, so no partial batch leaves early."""
    return make_pipeline(
        source,
        sink,
        model,
        clocks=Clocks(monotonic=lambda: 0.0),
        target_batch_size=model.target_batch_size,
        max_wait_s=60.0,
        max_in_flight=2,
        grace_s=5.0,
    )


async def run(source: FakeSource, sink: FakeSink, model: RowByRowModel) -> None:
    await asyncio.wait_for(pipeline(source, sink, model).run(asyncio.Event()), 10)


def too_long(value: float) -> RowError:
    return RowError(TOO_LONG, f"HTTP 400: maximum context length exceeded by row {value}")


def written(sink: CountingSink, messages: Mapping[int, Sequence[float]], bad: set[float]) -> None:
    """Every row of ``messages`` not in ``bad`` written exactly once, as ``2 x``; none of
    ``bad``."""
    want = {
        (f"chunk-{i}", r): v * 2 for i, values in messages.items() for r, v in enumerate(values)
    }
    want = {k: v for k, v in want.items() if v / 2 not in bad}
    assert sink.rows == want
    assert set(sink.times.values()) == {1}, sink.times


def parts_of(
    source: RowsSource,
) -> dict[tuple[str, tuple[int, ...]], tuple[list[float], DeadLetterReason]]:
    """(message, parent row indexes) -> (the part's x values, reason); each part checked to
    decode and to be keyed by its parent chunk and rows."""
    out = {}
    for mid, payload, attributes, reason in source.parts:
        parent = attributes[H_PARENT_CHUNK_ID]
        assert parent == f"chunk-{mid.removeprefix('m')}"
        part = decode_chunk(payload, attributes)
        rows = tuple(parse_rows(attributes[H_PARENT_ROWS], part.row_count).tolist())
        assert attributes[H_CHUNK_ID] == part_chunk_id(parent, list(rows))
        assert (mid, rows) not in out
        out[(mid, rows)] = ([float(v) for v in part.columns["x"].tolist()], reason)
    return out


async def test_failed_rows_are_dead_lettered_as_row_parts_and_the_rest_written_once() -> None:
    messages: dict[int, list[float]] = {
        0: [1, 2, 3],
        1: [4, -1, 5, -2, 6],  # with message 0: the first batch of 8
        2: [7, 8, -3, -4],
        3: [9, 10, 11, 12],  # with message 2: the second batch
        4: [13, -5],
        5: [-6],  # a message whose only row fails
    }
    errors = {
        -1.0: too_long(-1),
        -2.0: RowError(UNPARSEABLE, "the answer is not JSON: 'Sure! {'"),
        # Consecutive rows, one code, different words: one part, the first's words.
        -3.0: too_long(-3),
        -4.0: too_long(-4),
        -5.0: RowError("null_not_allowed", "column 'body' is null, and the prompt names it"),
        -6.0: too_long(-6),
    }
    source = RowsSource([message(i, values) for i, values in messages.items()])
    sink = CountingSink()
    model = RowByRowModel(errors, target=8)
    await run(source, sink, model)

    # One request per batch, each row sent once: nothing bisected, nothing sent again.
    assert model.calls[:2] == [[1, 2, 3, 4, -1, 5, -2, 6], [7, 8, -3, -4, 9, 10, 11, 12]]
    assert model.calls[2:] == [[13, -5, -6]]
    assert Counter(source.acked) == Counter(f"m{i}" for i in messages)  # each once
    assert source.dead == []
    assert source.nacked == []
    written(sink, messages, set(errors))
    parts = parts_of(source)
    assert set(parts) == {("m1", (1,)), ("m1", (3,)), ("m2", (2, 3)), ("m4", (1,)), ("m5", (0,))}
    for (mid, rows), (values, reason) in parts.items():
        assert reason.reason_class is ReasonClass.REJECTED_BY_MODEL, (mid, rows)
        assert values == [messages[int(mid[1:])][r] for r in rows]
    assert parts[("m1", (1,))][1].code == TOO_LONG
    assert parts[("m1", (1,))][1].message == too_long(-1).message
    assert parts[("m1", (3,))][1].code == UNPARSEABLE
    assert parts[("m1", (3,))][1].message == "the answer is not JSON: 'Sure! {'"
    assert parts[("m2", (2, 3))][1].code == TOO_LONG
    assert parts[("m2", (2, 3))][1].message == too_long(-3).message
    assert parts[("m4", (1,))][1].code == "null_not_allowed"
    assert parts[("m5", (0,))][1].code == TOO_LONG


async def test_failed_rows_of_a_message_spanning_batches_make_one_part() -> None:
    messages: dict[int, list[float]] = {0: [1, 2], 1: [3, -1, 4, 5, -2, 6], 2: [7]}
    errors = {-1.0: too_long(-1), -2.0: too_long(-2)}
    source, sink = RowsSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel(errors, target=4)
    await run(source, sink, model)
    assert model.calls == [[1, 2, 3, -1], [4, 5, -2, 6], [7]]
    assert sorted(source.acked) == ["m0", "m1", "m2"]
    assert source.dead == []
    written(sink, messages, set(errors))
    parts = parts_of(source)
    assert list(parts) == [("m1", (1, 4))]
    values, reason = parts[("m1", (1, 4))]
    assert values == [-1.0, -2.0]
    assert (reason.code, reason.message) == (TOO_LONG, too_long(-1).message)


async def test_a_batch_whose_every_row_fails_writes_nothing_and_acks_its_messages() -> None:
    messages: dict[int, list[float]] = {0: [-1, -2], 1: [-3]}
    errors = {v: too_long(v) for v in (-1.0, -2.0, -3.0)}
    source, sink = RowsSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel(errors, target=4)
    await run(source, sink, model)
    assert model.calls == [[-1, -2, -3]]
    assert sorted(source.acked) == ["m0", "m1"]
    assert sink.rows == {}
    assert set(parts_of(source)) == {("m0", (0, 1)), ("m1", (0,))}


async def test_without_row_dead_letters_the_message_holding_a_failed_row_goes_whole() -> None:
    messages: dict[int, list[float]] = {0: [1, 2, 3], 1: [4, -1, 5], 2: [6, 7]}
    source, sink = FakeSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel({-1.0: too_long(-1)}, target=8)
    await run(source, sink, model)
    assert model.calls == [[1, 2, 3, 4, -1, 5, 6, 7]]  # one request, not bisected
    [(mid, reason)] = source.dead
    assert mid == "m1"
    assert reason.reason_class is ReasonClass.REJECTED_BY_MODEL
    assert (reason.code, reason.message) == (TOO_LONG, too_long(-1).message)
    assert sorted(source.acked) == ["m0", "m2"]
    assert source.nacked == []
    written(sink, {0: messages[0], 2: messages[2]}, set())


async def test_without_row_dead_letters_a_spanning_message_loses_its_written_rows() -> None:
    # Message 1's first rows are answered (and written) in the first batch, its failed row in
    # the second: dead-lettered whole, its written rows deleted, so each row is in one place.
    messages: dict[int, list[float]] = {0: [1, 2], 1: [3, 4, 5, -1], 2: [6]}
    source, sink = FakeSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel({-1.0: too_long(-1)}, target=4)
    await run(source, sink, model)
    assert model.calls == [[1, 2, 3, 4], [5, -1, 6]]
    assert [mid for mid, _ in source.dead] == ["m1"]
    assert source.dead[0][1].code == TOO_LONG
    assert sorted(source.acked) == ["m0", "m2"]
    assert not any(key[0] == "chunk-1" for key in sink.rows)
    assert sink.rows == {("chunk-0", 0): 2.0, ("chunk-0", 1): 4.0, ("chunk-2", 0): 12.0}


async def test_a_handler_failing_no_row_is_answered_as_usual() -> None:
    messages: dict[int, list[float]] = {0: [1, 2, 3], 1: [4, 5]}
    source, sink = RowsSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel({-1.0: too_long(-1)}, target=8)
    await run(source, sink, model)
    assert model.calls == [[1, 2, 3, 4, 5]]
    assert sorted(source.acked) == ["m0", "m1"]
    assert source.parts == []
    written(sink, messages, set())


async def test_a_fatal_batch_then_failed_rows_while_bisecting() -> None:
    # A request of message 0 fails for good (a 500) and a row of message 2 is refused alone:
    # the engine bisects the batch (the error is fatal); message 0 should be nacked, message
    # 2's bad row dead-lettered alone, the rest written.
    messages: dict[int, list[float]] = {0: [99], 1: [1, 2], 2: [3, -1], 3: [4]}
    source, sink = RowsSource([message(i, v) for i, v in messages.items()]), CountingSink()
    model = RowByRowModel({-1.0: too_long(-1)}, target=8, crash=frozenset({99.0}))
    await run(source, sink, model)
    assert source.nacked == ["m0"]
    assert sorted(source.acked) == ["m1", "m2", "m3"]
    written(sink, {1: messages[1], 2: messages[2], 3: messages[3]}, {-1.0})
    assert set(parts_of(source)) == {("m2", (1,))}


async def test_a_row_whose_request_failed_for_good_nacks_its_message_only() -> None:
    # The OpenAI-compatible handler's 500 for one row's request: that row's message is nacked
    # (redelivered, not dead-lettered), the batch's other messages written, one request each.
    messages: dict[int, list[float]] = {0: [1, 2], 1: [3, 99], 2: [-1, 4]}
    source, sink = RowsSource([message(i, v) for i, v in messages.items()]), CountingSink()
    crashed = RowError("server_error", "HTTP 500: crashed", fatal=True)
    model = RowByRowModel({99.0: crashed, -1.0: too_long(-1)}, target=8)
    await run(source, sink, model)
    assert model.calls == [[1, 2, 3, 99, -1, 4]]  # no bisection, nothing sent again
    assert source.nacked == ["m1"]
    assert sorted(source.acked) == ["m0", "m2"]
    assert list(parts_of(source)) == [("m2", (0,))]  # message 2's bad row alone
    written(sink, {0: messages[0], 2: messages[2]}, {-1.0})
