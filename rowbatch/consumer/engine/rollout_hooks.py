"""What the inference stage is given of a rollout (``[model.candidate]``,
:mod:`rowbatch.consumer.rollout`): a canary to split batches with, or a shadow to tell of
each answered part."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.results import Answered
from rowbatch.consumer.engine.row_keys import RowKeys
from rowbatch.consumer.model.handler import ModelHandler

Infer = Callable[[Batch], Awaitable[list[Answered]]]
"""One arm's inference of a batch: its answered parts (isolating failures as the stage does)."""


class Canary(Protocol):
    """Splits each batch between the production model and ``model`` (the candidate):
    :class:`rowbatch.consumer.rollout.canary.Canary`."""

    @property
    def model(self) -> ModelHandler: ...

    async def infer(
        self, batch: Batch, keys: RowKeys, production: Infer, candidate: Infer
    ) -> list[Answered]:
        """Both arms' answers of ``batch`` (``keys``: its rows')."""
        ...


Shadowing = Callable[[Answered, RowKeys, float], None]
"""Told of each part the production model answered, its rows' keys and the seconds its
batch took; it must not block (a shadow copies what it takes and returns)."""


@dataclass(frozen=True)
class Rollout:
    canary: Canary | None = None
    shadow: Shadowing | None = None
