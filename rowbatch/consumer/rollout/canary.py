"""A canary: the rows whose key places them below the share are answered by the candidate
model and written to the result table with the name and version that answered; the others
by the production model. A batch is split by row; each arm runs (and isolates its failures)
as the production model alone does, both at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.engine.rollout_hooks import Infer
from rowbatch.consumer.engine.row_keys import RowKeys
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.rollout.metrics import RolloutMetrics


@dataclass(frozen=True)
class Canary:
    """The candidate, its share of the rows, and what its rows are written as."""

    model: ModelHandler
    share: float
    salt: str
    name: str
    """The candidate model's name, written with its rows."""
    version: str
    """Its configured version; ``""``: as each of its answers names it."""
    metrics: RolloutMetrics | None = None
    """Where each arm's rows (answered; failed: dead-lettered or nacked) and request time
    are counted."""
    clock: Callable[[], float] = time.monotonic

    def split(self, batch: Batch, keys: RowKeys) -> tuple[Batch | None, Batch | None]:
        """The batch's production rows and candidate rows."""
        places = key_places(keys.chunk_ids, keys.lengths, keys.row_index, self.salt)
        chosen = in_share(places, self.share)
        return batch.where(~chosen), batch.where(chosen)

    async def infer(
        self, batch: Batch, keys: RowKeys, production: Infer, candidate: Infer
    ) -> list[Answered]:
        """Both arms' answers (the candidate's parts naming the model and version that
        answered them)."""
        own, theirs = self.split(batch, keys)
        runs: list[Awaitable[list[Answered]]] = []
        if own is not None:
            runs.append(self._counted("production", own, production))
        if theirs is not None:
            runs.append(self._stamped(self._counted("candidate", theirs, candidate)))
        answered = await asyncio.gather(*runs)
        return [part for parts in answered for part in parts]

    async def _counted(self, arm: str, rows: Batch, infer: Infer) -> list[Answered]:
        started = self.clock()
        parts = await infer(rows)
        if self.metrics is not None:
            self.metrics.timed(arm, self.clock() - started)
            answered = sum(len(p.batch) for p in parts if p.errors is None)
            self.metrics.counted(arm, "answered", answered)
            self.metrics.counted(arm, "failed", len(rows) - answered)
        return parts

    async def _stamped(self, run: Awaitable[list[Answered]]) -> list[Answered]:
        return [
            replace(p, model_name=self.name, model_version=p.model_version or self.version)
            for p in await run
        ]
