"""``[model] isolation``: by default one failed batch is bisected at a time (a server that merges
concurrent requests would fail one isolation's attempts for another's poison); ``concurrent``
lets each batch's isolation run at once, for servers that fail each request on its own rows,
with the same outcome: exactly the bad rows dead-lettered, every other row written once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.observe.metrics import Metrics
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FnModel, Rejected, message
from tests.unit.consumer.engine.test_row_isolation import RowsSource


class Overlap:
    """A model answering ``2 x`` after yielding to the loop a few times, failing any request
    holding a negative ``x``; ``most``: the most isolation requests (smaller than a batch)
    holding a bad row at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def run(self, batch: Batch) -> Mapping[str, NDArray[Any]] | Answer:
        x = np.asarray(batch.columns["x"], np.float64)
        bad = bool((x < 0).any()) and len(x) < 8
        self.now += bad
        self.most = max(self.most, self.now)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
        finally:
            self.now -= bad
        if (x < 0).any():
            raise Rejected("negative value")
        return {"Y": x * 2}


@pytest.mark.parametrize(("serial", "overlapping"), [(True, False), (False, True)])
async def test_isolations_overlap_only_when_concurrent(serial: bool, overlapping: bool) -> None:
    # Four messages of 8 rows, one bad row each, in batches of 8 rows: four batches fail and
    # are isolated, 4 in flight.
    values = {m: [float(m * 10 + r) for r in range(8)] for m in range(4)}
    for m, row in values.items():
        row[m + 1] = -1.0
    source, sink = RowsSource([message(m, v) for m, v in values.items()]), FakeSink()
    model = Overlap()
    pipeline = make_pipeline(
        source,
        sink,
        FnModel(model.run, poison=Rejected),
        telemetry=Telemetry(Metrics()),
        target_batch_size=8,
        max_wait_s=0.0,
        max_in_flight=4,
        serial_isolation=serial,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)
    assert sorted(source.acked) == ["m0", "m1", "m2", "m3"]
    assert sorted((mid, attrs["rowbatch-parent-rows"]) for mid, _, attrs, _ in source.parts) == [
        (f"m{m}", str(m + 1)) for m in range(4)
    ]
    want = {
        (f"chunk-{m}", r): v * 2 for m, vs in values.items() for r, v in enumerate(vs) if v >= 0
    }
    assert sink.rows == want
    # The isolations' requests holding a bad row overlap only when concurrent.
    assert (model.most > 1) is overlapping
