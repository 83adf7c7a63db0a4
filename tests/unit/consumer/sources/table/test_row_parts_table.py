"""Table mode dead-letters rows on their own (``DeadLettersRows``): the rows of a chunk that fail
alone (the model's per-row rejections, the sink's refused rows) go straight to the shard's
dead-letter file, one line each, the same lines the halving path writes for them, and the
chunk's other rows are written once: no halves, no second request for the good rows. The lines
and the progress are durable before the chunk is acked, so a rerun does nothing, and a kill at
any point leaves neither a duplicate line nor a row written twice."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import orjson
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, RowsRejected
from rowbatch.consumer.sources.base import DeadLetterFailed, DeadLettersRows
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.table import source as source_module
from rowbatch.consumer.sources.table.checkpoint import Checkpoint, Settled
from rowbatch.consumer.sources.table.dead_letters import DEAD_LETTER_PREFIX, read_dead_letters
from rowbatch.consumer.sources.table.settings import JOB_INDEX_VARIABLE, TableSettings
from rowbatch.consumer.sources.table.source import TableModel, TableSource
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.timing import SYSTEM_CLOCKS, Clocks
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.chunks.row_parts import row_part
from rowbatch.wire.dead_letter import ReasonClass
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink
from tests.unit.consumer.sources.table.data import ids_of, write_parquet
from tests.unit.consumer.sources.table.test_source import Rig, folder_of

ROWS: Final = 50
BAD_IDS: Final = (7, 31)
"""Rows of the 50-row chunk the model rejects on their own (``x`` = id / 2)."""
TARGET: Final = 10
"""The model's batch: the chunk is 5 batches."""
TOO_LONG: Final = "prompt_too_long"
KILLED: Final = 137
ROOT: Final = Path(__file__).resolve().parents[5]
"""The repository (the kill tests run a first run in a process of its own from there)."""
CHUNK: Final = "a.parquet@0"


@pytest.fixture(autouse=True)
def _no_job_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOB_INDEX_VARIABLE, raising=False)


def settings_of(tmp_path: Path) -> TableSettings:
    return TableSettings.model_validate(
        {"input": str(tmp_path / "in"), "state": str(tmp_path / "state"), "chunk_rows": ROWS}
    )


def new_source(tmp_path: Path, cls: type[TableSource] = TableSource, **kwargs: Any) -> TableSource:
    return cls(
        settings_of(tmp_path),
        model=TableModel("scorer", "1", {"inputs": {"x": "X"}, "passthrough": {"id": "int64"}}),
        columns=["id", "x"],
        **kwargs,
    )


class HalvingSource(TableSource):
    """The table source as it was: no rows dead-lettered on their own (the engine fails the
    whole chunk, which the source cuts in halves)."""

    @property
    def dead_letters_rows(self) -> bool:
        return False


def too_long(value: float | None = None) -> RowError:
    """The server's 400 for a row, in the same words for every row unless ``value`` is named
    in them."""
    words = "HTTP 400: maximum context length exceeded"
    return RowError(TOO_LONG, words if value is None else f"{words} by x={value}")


class RowModel:
    """Answers ``Y = 2 x`` row by row; a row whose ``x`` is in ``errors`` fails on its own
    (the batch raises ``RowsFailed``, as the OpenAI-compatible handler does). ``calls``: the
    ``x`` values of each request."""

    def __init__(self, errors: Mapping[float, RowError], target: int = TARGET) -> None:
        self.errors = dict(errors)
        self.target_batch_size = target
        self.output_bytes_per_row = 8
        self.calls: list[list[float]] = []

    def check(self, chunk: DecodedChunk) -> None:
        pass

    async def run(self, batch: BatchRows) -> Answer:
        x: NDArray[np.float64] = np.asarray(batch.columns["x"], np.float64)
        values = [float(v) for v in x.tolist()]
        self.calls.append(values)
        answer = Answer({"Y": x * 2}, "1")
        failed = {row: self.errors[v] for row, v in enumerate(values) if v in self.errors}
        if failed:
            raise RowsFailed(answer, failed)
        return answer

    def is_poison(self, exc: BaseException) -> bool:
        return False

    def is_fatal(self, exc: BaseException) -> bool:
        return False

    def rows_sent(self) -> Counter[float]:
        return Counter(v for call in self.calls for v in call)


def bad_model(*, own_words: bool = False) -> RowModel:
    """The model rejecting ``BAD_IDS``; ``own_words``: each with its own message."""
    return RowModel({i / 2: too_long(i / 2 if own_words else None) for i in BAD_IDS})


class CountingSink(FakeSink):
    """Counts how often each row (``(chunk_id, row_index)``) is written; ``refuse``: ``y``
    values it rejects (a database refusing a value), the write failing as a whole."""

    def __init__(self, refuse: Iterable[float] = ()) -> None:
        super().__init__()
        self.times: Counter[tuple[str, int]] = Counter()
        self.refuse = frozenset(refuse)

    async def write(self, rows: ResultRows) -> int:
        if self.refuse & {float(v) for v in np.asarray(rows.outputs["y"]).tolist()}:
            raise RowsRejected("value refused by a CHECK constraint", code="check_violation")
        for cid, idx in zip(rows.chunk_id, rows.row_index, strict=True):
            self.times[(str(cid), int(idx))] += 1
        return await super().write(rows)


class LoggedSink(CountingSink):
    """Also appends each written row's key to ``path`` as it writes (it outlives a kill)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    async def write(self, rows: ResultRows) -> int:
        stored = await super().write(rows)
        keys = zip(rows.chunk_id, rows.row_index, strict=True)
        with self.path.open("a") as f:
            f.write("".join(f"{cid}\t{idx}\n" for cid, idx in keys))
        return stored


def logged_rows(path: Path) -> Counter[tuple[str, int]]:
    if not path.exists():
        return Counter()
    lines = path.read_text().splitlines()
    return Counter((cid, int(idx)) for cid, idx in (line.split("\t") for line in lines))


def pipeline(
    source: TableSource, sink: FakeSink, model: RowModel, *, fixed: bool, **settings: Any
) -> Pipeline:
    """``fixed``: batches of exactly ``model.target_batch_size`` rows (the clock stands still,
    so no partial batch leaves early); else partial batches leave at once."""
    return make_pipeline(
        source,
        sink,
        model,
        clocks=Clocks(monotonic=lambda: 0.0) if fixed else SYSTEM_CLOCKS,
        target_batch_size=model.target_batch_size,
        max_wait_s=60.0 if fixed else 0.0,
        **({"max_in_flight": 2, "grace_s": 5.0} | settings),
    )


async def run(
    source: TableSource, sink: FakeSink, model: RowModel, *, fixed: bool = True, **settings: Any
) -> None:
    await source.check()
    built = pipeline(source, sink, model, fixed=fixed, **settings)
    await asyncio.wait_for(built.run(asyncio.Event()), 20)


def raw_lines(tmp_path: Path) -> list[dict[str, Any]]:
    """Every line of every dead-letter file, as written (no deduplication)."""
    folder = folder_of(tmp_path)
    out = []
    for name in folder.names(DEAD_LETTER_PREFIX):
        text = folder.read(name) or ""
        out += [orjson.loads(line) for line in text.splitlines() if line]
    return out


def good_keys() -> set[tuple[str, int]]:
    return {(CHUNK, r) for r in range(ROWS) if r not in BAD_IDS}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """One Parquet file of 50 rows: one chunk."""
    write_parquet(tmp_path / "in" / "a.parquet", 0, ROWS, ROWS)
    return tmp_path


def test_the_table_source_dead_letters_rows(table: Path) -> None:
    source = new_source(table)
    assert isinstance(source, DeadLettersRows) and source.dead_letters_rows
    assert not new_source(table, HalvingSource).dead_letters_rows


async def test_two_bad_rows_of_fifty_cost_two_lines_and_the_rest_is_written_once(
    table: Path,
) -> None:
    source, sink, model = new_source(table), CountingSink(), bad_model()
    await run(source, sink, model)

    # One request per batch, every row sent once: nothing halved, nothing sent again.
    assert [len(call) for call in model.calls] == [TARGET] * (ROWS // TARGET)
    assert model.rows_sent() == Counter(i / 2 for i in range(ROWS))
    assert set(sink.times) == good_keys()
    assert set(sink.times.values()) == {1}
    lines = raw_lines(table)
    assert [(r["chunk_id"], r["row_index"], r["file"], r["file_row"]) for r in lines] == [
        (CHUNK, i, "a.parquet", i) for i in BAD_IDS
    ]
    for record, i in zip(lines, BAD_IDS, strict=True):
        assert record["reason"] == ReasonClass.REJECTED_BY_MODEL.value
        assert (record["code"], record["message"]) == (TOO_LONG, too_long().message)
        assert record["row"] == {"id": i, "x": i / 2}
        assert record["attempt"] == 1
    assert source.complete
    counts = source.counts
    assert (counts.read, counts.written, counts.dead_lettered) == (ROWS, ROWS - 2, 2)

    # A rerun on the same state: nothing read, nothing sent, nothing written, no line added.
    rerun, sink2, model2 = new_source(table), CountingSink(), bad_model()
    await run(rerun, sink2, model2)
    assert rerun.counts.skipped == ROWS
    assert (rerun.counts.read, rerun.counts.written, rerun.counts.dead_lettered) == (0, 0, 0)
    assert model2.calls == []
    assert sink2.times == Counter()
    assert raw_lines(table) == lines
    assert rerun.complete


async def test_the_lines_are_those_the_halving_path_writes(table: Path, tmp_path: Path) -> None:
    """The same table through the halving path (a source that cannot dead-letter rows) writes
    the same lines for the same rows (but the time), after sending the good rows again."""
    halving = tmp_path / "halving"
    write_parquet(halving / "in" / "a.parquet", 0, ROWS, ROWS)
    old, old_model = new_source(halving, HalvingSource), bad_model()
    await run(old, CountingSink(), old_model, fixed=False)
    assert old.complete and old.counts.dead_lettered == 2
    assert sum(old_model.rows_sent().values()) > ROWS  # the halves went round

    new, new_model = new_source(table), bad_model()
    await run(new, CountingSink(), new_model, fixed=False)
    assert sum(new_model.rows_sent().values()) == ROWS

    def without_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(({k: v for k, v in r.items() if k != "at"} for r in records), key=str)

    assert without_time(raw_lines(table)) == without_time(raw_lines(halving))


async def test_each_line_keeps_its_rows_own_words(table: Path) -> None:
    source = new_source(table)
    await run(source, CountingSink(), bad_model(own_words=True))
    assert [(r["file_row"], r["message"]) for r in raw_lines(table)] == [
        (i, too_long(i / 2).message) for i in BAD_IDS
    ]


async def test_rows_the_sink_refuses_cost_their_rows_only(table: Path) -> None:
    source, model = new_source(table), RowModel({})
    sink = CountingSink(refuse={float(i) for i in BAD_IDS})  # y = 2 x = id
    await run(source, sink, model)
    assert model.rows_sent() == Counter(i / 2 for i in range(ROWS))  # the model ran once
    assert set(sink.times) == good_keys()
    assert set(sink.times.values()) == {1}
    lines = raw_lines(table)
    assert [(r["row_index"], r["reason"], r["code"]) for r in lines] == [
        (i, ReasonClass.REJECTED_BY_SINK.value, "check_violation") for i in BAD_IDS
    ]
    assert source.complete
    assert (source.counts.written, source.counts.dead_lettered) == (ROWS - 2, 2)

    # The engine does not tell the rows it wrote beside a refused row in the same write
    # (write_stage: a segment with rejected rows is left out of rows_written), and the ack
    # of a chunk with dead-lettered rows records nothing: a rerun writes those again under
    # the same keys, and nothing else.
    rerun, model2 = new_source(table), RowModel({})
    await run(rerun, sink, model2, fixed=False)
    batch_mates = {
        (CHUNK, r) for i in BAD_IDS for r in range(i - i % TARGET, i - i % TARGET + TARGET)
    } - {(CHUNK, i) for i in BAD_IDS}
    assert {k for k, n in sink.times.items() if n > 1} <= batch_mates
    assert set(sink.times) == good_keys()
    assert not {i / 2 for i in BAD_IDS} & set(model2.rows_sent())
    assert len(raw_lines(table)) == 2
    assert rerun.complete
    again = new_source(table)
    await run(again, CountingSink(), RowModel({}), fixed=False)
    assert again.counts.skipped == ROWS and again.counts.read == 0
    assert len(raw_lines(table)) == 2


async def test_after_rows_the_sink_refuses_a_rerun_reads_nothing(table: Path) -> None:
    sink = CountingSink(refuse={float(i) for i in BAD_IDS})
    await run(new_source(table), sink, RowModel({}))
    rerun = new_source(table)
    await run(rerun, sink, RowModel({}), fixed=False)
    assert rerun.counts.skipped == ROWS and rerun.counts.read == 0


class StagingSink(CountingSink):
    """A sink that stages its writes (``CommitsWrites``): rows are part of the table at
    ``commit``; ``staged`` the keys written since the last one."""

    target_file_bytes = 1 << 40

    def __init__(self) -> None:
        super().__init__()
        self.staged: set[tuple[str, int]] = set()
        self.commits = 0

    async def write(self, rows: ResultRows) -> int:
        self.staged |= {
            (str(c), int(i)) for c, i in zip(rows.chunk_id, rows.row_index, strict=True)
        }
        return await super().write(rows)

    async def commit(self) -> None:
        self.staged = set()
        self.commits += 1

    def uncommitted_bytes(self) -> int:
        return 8 * len(self.staged)


async def test_with_a_staging_sink_no_row_is_recorded_before_its_commit(table: Path) -> None:
    """The chunk's last batch fails whole, row by row: the engine acks the chunk then, before
    the commit holding its first rows. The ack records none of them (a kill before the commit
    would lose them): they are recorded when the commit is told (``rows_written``)."""
    sink = StagingSink()
    uncommitted_recorded: list[tuple[str, int]] = []

    class Checked(TableSource):
        async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
            await super().ack_many(deliveries)
            assert self._checkpoint is not None
            uncommitted_recorded.extend(
                key for key in sink.staged if not self._checkpoint.missing("a.parquet", key[1], 1)
            )

    class Slow(RowModel):
        async def run(self, batch: BatchRows) -> Answer:
            if set(np.asarray(batch.columns["x"]).tolist()) & set(self.errors):
                await asyncio.sleep(0.3)  # the other batches are written (staged) first
            return await super().run(batch)

    model = Slow({i / 2: too_long() for i in range(ROWS - TARGET, ROWS)})
    source = new_source(table, Checked)
    await run(source, sink, model, fixed=False, commit_interval_s=1.0)
    assert sink.commits >= 1
    assert uncommitted_recorded == []
    assert len(raw_lines(table)) == TARGET
    assert source.complete
    rerun = new_source(table)
    await rerun.check()
    assert rerun.counts.skipped == ROWS


# --- a kill at any point ------------------------------------------------------------------------


def killed_run(root: str, kill: str) -> None:
    """The first run, in a process of its own, killed (``os._exit``) at ``kill``:
    ``dead_letters`` just after the dead-letter file was written, before the progress records
    the rows; ``ack`` after both, before the chunk is acked."""
    tmp = Path(root)
    patch = pytest.MonkeyPatch()
    if kill == "dead_letters":
        real = Checkpoint.record

        def record(self: Checkpoint, settled: Iterable[Settled]) -> None:
            items = list(settled)
            if any(s.outcome == "d" for s in items):
                os._exit(KILLED)
            real(self, items)

        patch.setattr(Checkpoint, "record", record)
    else:

        async def ack_many(self: TableSource, deliveries: object) -> None:
            os._exit(KILLED)

        patch.setattr(TableSource, "ack_many", ack_many)
    asyncio.run(run(new_source(tmp), LoggedSink(tmp / "sink.log"), bad_model()))
    os._exit(0)  # not killed: the test fails on the exit status


@pytest.mark.parametrize("kill", ["dead_letters", "ack"])
async def test_a_kill_then_a_rerun_writes_each_good_row_once_and_each_line_once(
    table: Path, kill: str
) -> None:
    script = (
        "import sys\n"
        "from tests.unit.consumer.sources.table.test_row_parts_table import killed_run\n"
        "killed_run(sys.argv[1], sys.argv[2])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != JOB_INDEX_VARIABLE}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", script, str(table), kill],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == KILLED, done.stderr[-3000:]
    first = logged_rows(table / "sink.log")
    assert set(first) == good_keys(), "the good rows were written before the kill"
    assert len(raw_lines(table)) == len(BAD_IDS), "the lines were written before the kill"

    rerun, sink, model = new_source(table), CountingSink(), bad_model()
    await run(rerun, sink, model, fixed=False)  # what is left leaves in partial batches
    assert rerun.complete
    assert first + sink.times == Counter(good_keys())  # each good row written once in all
    lines = raw_lines(table)
    assert sorted(r["file_row"] for r in lines) == list(BAD_IDS)  # no line twice
    assert model.calls == [], "the good rows were recorded, the bad ones have their lines"
    assert rerun.counts.skipped == ROWS

    again = new_source(table)
    await run(again, CountingSink(), bad_model(), fixed=False)
    assert again.counts.skipped == ROWS and again.counts.read == 0
    assert len(raw_lines(table)) == len(BAD_IDS)


# --- the source on its own ----------------------------------------------------------------------


REJECTED = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, "HTTP 400", TOO_LONG)


def row_index_of(tmp_path: Path) -> dict[int, tuple[str, int]]:
    return {r["file_row"]: (r["chunk_id"], r["row_index"]) for r in raw_lines(tmp_path)}


async def test_a_part_of_a_chunk_keeps_the_chunks_keys(tmp_path: Path) -> None:
    """A rerun's part of a chunk (rows 3-7 of chunk ``@0``): its row 1 is the chunk's row 4."""
    write_parquet(tmp_path / "in" / "a.parquet", 0, 8, 8)
    settings = TableSettings.model_validate(
        {"input": str(tmp_path / "in"), "state": str(tmp_path / "state"), "chunk_rows": 8}
    )
    model = TableModel("scorer", "1", {"inputs": {"x": "X"}, "passthrough": {"id": "int64"}})
    first = TableSource(settings, model=model, columns=["id", "x"])
    await first.check()
    whole = await Rig(first).take("a.parquet@0")
    await first.rows_written([(whole, 0, 3)])
    await first.close()  # killed

    source = TableSource(settings, model=model, columns=["id", "x"])
    await source.check()
    rig = Rig(source)
    rest = await rig.take("a.parquet@3")
    assert rest.row_offset == 3 and ids_of(rest) == [3, 4, 5, 6, 7]
    payload, attributes = row_part(rest.payload, rest.attributes, [1])
    await source.dead_letter_rows(rest, payload, attributes, REJECTED)
    await source.ack(rest)
    await rig.drain()
    assert source.complete
    assert (source.counts.written, source.counts.dead_lettered) == (4, 1)
    assert row_index_of(tmp_path) == {4: ("a.parquet@0", 4)}
    [record] = read_dead_letters(folder_of(tmp_path))
    assert record["row"] == {"id": 4, "x": 2.0}


async def test_a_progress_write_failing_writes_the_lines_once(
    table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails the progress record once, after the lines were written: the write is
    tried again (after a backoff), without writing the lines a second time."""
    slept: list[float] = []

    async def record_sleep(seconds: float) -> None:
        slept.append(seconds)

    source = new_source(table, async_sleep=record_sleep)
    await source.check()
    rig = Rig(source)
    chunk = await rig.take(CHUNK)
    real = StateFolder.write_segment
    failures = [OSError("store down")]

    def flaky(self: StateFolder, prefix: str, lines: Iterable[str]) -> str:
        if failures:
            raise failures.pop()
        return real(self, prefix, lines)

    monkeypatch.setattr(StateFolder, "write_segment", flaky)
    payload, attributes = row_part(chunk.payload, chunk.attributes, list(BAD_IDS))
    await source.dead_letter_rows(chunk, payload, attributes, REJECTED)
    assert slept == [1.0]
    assert sorted(row_index_of(table)) == list(BAD_IDS)
    assert len(raw_lines(table)) == 2
    await source.ack(chunk)
    await rig.drain()
    assert source.complete
    assert (source.counts.written, source.counts.dead_lettered) == (ROWS - 2, 2)


async def test_a_dead_letter_write_that_fails_raises_dead_letter_failed_and_settles_nothing(
    table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = new_source(table)
    await source.check()
    rig = Rig(source)
    chunk = await rig.take(CHUNK)
    payload, attributes = row_part(chunk.payload, chunk.attributes, [7])

    def broken(folder: StateFolder, lines: list[bytes]) -> str | None:
        raise RuntimeError("encoder bug")

    monkeypatch.setattr(source_module, "write_dead_letters", broken)
    with pytest.raises(DeadLetterFailed, match="encoder bug"):
        await source.dead_letter_rows(chunk, payload, attributes, REJECTED)
    monkeypatch.undo()
    assert raw_lines(table) == []
    # The engine nacks it: it comes back whole, and this time the row goes.
    await source.nack(chunk)
    again = await rig.take(CHUNK)
    assert again.delivery_attempt == 2
    await source.dead_letter_rows(again, payload, attributes, REJECTED)
    # Dead-lettered again after another nack (a later part not confirmed): no second line.
    await source.nack(again)
    third = await rig.take(CHUNK)
    await source.dead_letter_rows(third, payload, attributes, REJECTED)
    await source.ack(third)
    await rig.drain()
    assert [r["attempt"] for r in raw_lines(table)] == [2]
    assert (source.counts.written, source.counts.dead_lettered) == (ROWS - 1, 1)


async def test_a_row_part_that_is_not_of_the_chunk_raises_dead_letter_failed(
    table: Path,
) -> None:
    source = new_source(table)
    await source.check()
    chunk = await Rig(source).take(CHUNK)
    payload, attributes = row_part(chunk.payload, chunk.attributes, [7])
    with pytest.raises(DeadLetterFailed, match="not a row part"):
        await source.dead_letter_rows(
            chunk, payload, {**attributes, "rowbatch-parent-chunk-id": "b.parquet@0"}, REJECTED
        )
    assert raw_lines(table) == []


async def test_a_chunk_dead_lettered_whole_after_some_rows_went_alone_has_one_line_each(
    table: Path,
) -> None:
    """Rows dead-lettered on their own, the chunk nacked (another part not confirmed), then
    dead-lettered whole for a reason that holds for every row: each row has one line."""
    source = new_source(table)
    await source.check()
    rig = Rig(source)
    chunk = await rig.take(CHUNK)
    payload, attributes = row_part(chunk.payload, chunk.attributes, list(BAD_IDS))
    await source.dead_letter_rows(chunk, payload, attributes, REJECTED)
    await source.nack(chunk)
    again = await rig.take(CHUNK)
    whole = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "no column 'y'", "missing_column")
    await source.dead_letter(again, whole)
    await rig.drain()
    lines = raw_lines(table)
    assert sorted(r["file_row"] for r in lines) == list(range(ROWS))
    assert {r["file_row"] for r in lines if r["code"] == TOO_LONG} == set(BAD_IDS)
    assert source.complete
    assert (source.counts.written, source.counts.dead_lettered) == (0, ROWS)


async def test_with_error_rows_every_row_is_written_once_and_no_line_is_written(
    table: Path,
) -> None:
    """``on_row_error = "error-row"`` in table mode: the rows the model fails are written as
    error rows (their keys recorded as done with the rest), no dead-letter line; a rerun reads
    nothing."""
    error_rows = (ColumnSpec("y", "float64"), *(ColumnSpec(n, "object") for n in ERROR_COLUMNS))
    source, sink = new_source(table), CountingSink()
    await run(source, sink, bad_model(), error_rows=error_rows)
    assert set(sink.times) == {(CHUNK, r) for r in range(ROWS)}
    assert set(sink.times.values()) == {1}
    assert raw_lines(table) == []
    assert source.complete
    rerun, sink2, model2 = new_source(table), CountingSink(), bad_model()
    await run(rerun, sink2, model2, error_rows=error_rows)
    assert rerun.counts.skipped == ROWS and rerun.counts.read == 0
    assert model2.calls == [] and sink2.times == Counter()
