"""``StageContext``: what the stages of one pipeline share (the ledger, the settler, the
batcher between intake and inference, the metrics, the clock and the two events that pass
rows along), built once by :class:`rowbatch.consumer.engine.pipeline.Pipeline`, so a stage's
constructor names only what is its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rowbatch.consumer.engine.batcher import Batcher
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.settle import Settler
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer
from rowbatch.timing import Clock


@dataclass(frozen=True)
class StageContext:
    ledger: Ledger
    """Every message taken and not yet settled, with its unresolved rows."""
    settler: Settler
    """Acks, nacks, dead letters and withdrawals, each exactly once per message."""
    batcher: Batcher
    """Rows queued by intake, packed into batches for inference."""
    metrics: Metrics
    clock: Clock
    rows_queued: asyncio.Event
    """Set when intake queues rows in the batcher (wakes the batch flush)."""
    rows_taken: asyncio.Event
    """Set when rows leave the batcher (wakes intake waiting for the work bound)."""
    tracing: PipelineTracer = NO_TRACING
    """The spans (docs/tracing.md); ``NO_TRACING`` when tracing is off."""
