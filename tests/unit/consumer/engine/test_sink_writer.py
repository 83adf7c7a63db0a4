"""SinkWriter's counts: what the sink says it stored is ``rowbatch_rows_written_total``; rows a
write skipped because their key was there already (a redelivery) are
``rowbatch_rows_duplicate_total``, not written ones."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client import CollectorRegistry

from rowbatch.consumer.engine.sink_writer import SinkRetry, SinkWriter
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import ResultRows
from tests.sink_data import make_rows
from tests.unit.consumer.engine.factories import sink_backoff


class KeyedSink:
    """Stores each (chunk_id, row_index) once, like every real sink, and says how many."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, int]] = set()

    async def write(self, rows: ResultRows) -> int:
        before = len(self.keys)
        self.keys.update(zip(map(str, rows.chunk_id), map(int, rows.row_index), strict=True))
        return len(self.keys) - before


def counted(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None
    return value


async def test_rows_already_there_count_as_duplicates_not_as_written() -> None:
    metrics = Metrics(CollectorRegistry())
    sink = KeyedSink()

    def build(parts: Sequence[np.ndarray]) -> ResultRows:
        return make_rows(np.concatenate(list(parts)))

    retry = SinkRetry(metrics=metrics, backoff=sink_backoff())
    writer = SinkWriter[np.ndarray](
        sink.write, build=build, split=lambda p: [p], metrics=metrics, retry=retry
    )
    assert await writer.write([np.arange(0, 100)]) == []
    assert await writer.write([np.arange(50, 150)]) == []  # a redelivery overlapping the first
    assert await writer.write([np.arange(0, 150)]) == []  # all of it again
    assert counted(metrics, "rowbatch_rows_written_total") == 150
    assert counted(metrics, "rowbatch_rows_duplicate_total") == 50 + 150
