"""With a sink that stages its writes (``CommitsWrites``), a message is acked only after the
commit that holds its rows, also when the last of its rows to resolve fail on their own (they
go as a row part, the rest written): an ack before the commit would let a kill lose the staged
rows (a broker's offset committed past them, a table run's progress recording them)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.timing import SYSTEM_CLOCKS
from rowbatch.wire.chunks.decode import DecodedChunk
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_row_progress import CommittingSink, Event, ProgressSource, part


class RowPartSource(ProgressSource):
    """Keeps progress per row and dead-letters rows (logged as ``("part", message_id)``)."""

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
        self.log.append(("part", delivery.message_id))


class LastBatchFails:
    """``Y = 2 x``; rows with a negative ``x`` fail on their own (``RowsFailed``), after a
    pause so the batches before are written first."""

    target_batch_size = 4
    output_bytes_per_row = 8

    def check(self, chunk: DecodedChunk) -> None:
        pass

    async def run(self, batch: BatchRows) -> Answer:
        x: NDArray[np.float64] = np.asarray(batch.columns["x"], np.float64)
        answer = Answer({"Y": x * 2}, "1")
        failed = {i: RowError("prompt_too_long", "HTTP 400") for i, v in enumerate(x) if v < 0}
        if failed:
            await asyncio.sleep(0.2)
            raise RowsFailed(answer, failed)
        return answer

    def is_poison(self, exc: BaseException) -> bool:
        return False

    def is_fatal(self, exc: BaseException) -> bool:
        return False


async def test_a_message_completed_by_failed_rows_is_acked_after_the_commit() -> None:
    log: list[Event] = []
    values = [1.0, 2.0, 3.0, 4.0, -1.0, -2.0, -3.0, -4.0]  # the second batch fails whole
    source, sink = RowPartSource([part("c", values, 0)], log), CommittingSink(log)
    pipeline = make_pipeline(
        source,
        sink,
        LastBatchFails(),
        clocks=SYSTEM_CLOCKS,
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=1,
        grace_s=5.0,
        commit_interval_s=0.5,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)
    kinds = [kind for kind, _ in log]
    assert {"write", "part", "ack", "commit"} <= set(kinds)
    assert kinds.index("commit") < kinds.index("ack"), kinds
