"""A chunk the model fails for good (neither transient nor about its rows: Triton's INTERNAL,
an OpenAI-compatible server's 500) goes round a table run at most ``max_delivery_attempts``
times; then its rows are dead-lettered as ``too-many-attempts``, all at once (not halved: the
reason holds for every row), and the run ends instead of sending it to the model forever."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.decode import MessageDecoder
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.model.inference.errors import FatalInferenceError
from rowbatch.consumer.sources.table.settings import TableSettings
from rowbatch.consumer.sources.table.source import TableModel, TableSource
from rowbatch.wire.chunks.decode import DecodedChunk
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.sources.table.data import write_parquet
from tests.unit.consumer.sources.table.test_row_parts_table import CountingSink, raw_lines

ROWS = 20


class BrokenModel:
    """Fails every request for good (a 500): nothing is ever answered."""

    target_batch_size = ROWS
    output_bytes_per_row = 8

    def __init__(self) -> None:
        self.calls = 0

    def check(self, chunk: DecodedChunk) -> None:
        pass

    async def run(self, batch: BatchRows) -> Answer:
        self.calls += 1
        x: NDArray[np.float64] = np.asarray(batch.columns["x"], np.float64)
        raise FatalInferenceError(f"HTTP 500 for {len(x)} rows", model="m", status="500")

    def is_poison(self, exc: BaseException) -> bool:
        return False

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, FatalInferenceError)


async def test_a_chunk_failing_for_good_is_dead_lettered_after_its_attempts(
    tmp_path: Path,
) -> None:
    write_parquet(tmp_path / "in" / "a.parquet", 0, ROWS, ROWS)
    settings = TableSettings.model_validate(
        {
            "input": str(tmp_path / "in"),
            "state": str(tmp_path / "state"),
            "chunk_rows": ROWS,
            "max_delivery_attempts": 3,
        }
    )
    source = TableSource(
        settings,
        model=TableModel("scorer", "1", {"inputs": {"x": "X"}}),
        columns=["id", "x"],
    )
    model, sink = BrokenModel(), CountingSink()
    await source.check()
    decoder = MessageDecoder(("x",), lambda _chunk: None, settings.max_delivery_attempts)
    built = make_pipeline(
        source,
        sink,
        model,
        decoder=decoder,
        target_batch_size=ROWS,
        max_wait_s=0.0,
        max_in_flight=1,
    )
    await asyncio.wait_for(built.run(asyncio.Event()), 20)

    assert model.calls == 3  # then the decoder turns the chunk away before the model
    lines = raw_lines(tmp_path)
    assert len(lines) == ROWS  # every row once, none written
    assert {line["reason"] for line in lines} == {"too-many-attempts"}
    assert not sink.times
