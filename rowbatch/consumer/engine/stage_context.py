"""What the stages of one pipeline share, built once by
:class:`rowbatch.consumer.engine.pipeline.Pipeline`, so a stage's constructor names only what is
its own: :class:`Telemetry` (what they report to) and :class:`StageContext` (the ledger, the
batcher between intake and inference, the byte budget, the telemetry, the clocks and the two
events that pass rows along)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rowbatch.consumer.engine.batcher import Batcher
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.scaling import ScalingSignal
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer
from rowbatch.timing import Clocks


@dataclass(frozen=True)
class Telemetry:
    """What the pipeline reports to (all of it from :mod:`rowbatch.consumer.observe`)."""

    metrics: Metrics
    signal: ScalingSignal | None = None
    """The autoscaling signal: told of rows received and written and, every watch interval,
    of the pipeline's state (None: no signal)."""
    tracing: PipelineTracer = NO_TRACING
    """The spans (docs/tracing.md); ``NO_TRACING`` when tracing is off."""


@dataclass(frozen=True)
class StageContext:
    ledger: Ledger
    """Every message taken and not yet settled, with its unresolved rows."""
    batcher: Batcher
    """Rows queued by intake, packed into batches for inference."""
    budget: ByteBudget
    """The memory budget: taken by intake for each message, released when it is settled."""
    telemetry: Telemetry
    clocks: Clocks
    rows_queued: asyncio.Event
    """Set when intake queues rows in the batcher (wakes the batch flush)."""
    rows_taken: asyncio.Event
    """Set when rows leave the batcher (wakes intake waiting for the work bound)."""
