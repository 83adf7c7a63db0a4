"""A canary: the rows whose key places them below the share are answered by the candidate
model and written to the result table with the name and version that answered; the others
by the production model. A batch is split by row; each arm runs (and isolates its failures)
as the production model alone does, both at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.engine.rollout_hooks import Infer
from rowbatch.consumer.engine.row_keys import RowKeys
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.rollout.arms import in_share, key_places


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
    on_rows: Callable[[str, int], None] = lambda arm, rows: None
    """Told of the rows each arm (``production``, ``candidate``) is given."""

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
            self.on_rows("production", len(own))
            runs.append(production(own))
        if theirs is not None:
            self.on_rows("candidate", len(theirs))
            runs.append(self._stamped(candidate(theirs)))
        answered = await asyncio.gather(*runs)
        return [part for parts in answered for part in parts]

    async def _stamped(self, run: Awaitable[list[Answered]]) -> list[Answered]:
        return [
            replace(p, model_name=self.name, model_version=p.model_version or self.version)
            for p in await run
        ]
