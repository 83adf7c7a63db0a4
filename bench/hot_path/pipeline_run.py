"""One run of the real ``Pipeline`` for the hot-path profile: a list source, the example model's
binding and result table, a given sink and model handler, timed (process CPU) and optionally
profiled; both the per-row and the per-message tables run their cases through it."""

from __future__ import annotations

import asyncio
import pstats
import time
from collections.abc import Sequence

from bench.hot_path.fakes import BINDINGS, MODELS, TABLES, list_source
from bench.hot_path.timers import profiled
from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.decode import MessageDecoder, SchemaCheck
from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.pipeline import Pipeline, PipelineHooks, PipelineSettings
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sinks.base import Sink
from rowbatch.consumer.sinks.settings import IcebergSinkSettings, SqliteSinkSettings
from rowbatch.consumer.sources.delivery import Delivery

UNBOUNDED = 1 << 40
"""The byte budget of a hot-path run: larger than anything it holds."""


def run_pipeline(
    kind: str,
    deliveries: Sequence[Delivery],
    *,
    sink: Sink,
    check: SchemaCheck,
    model: ModelHandler,
    profile: bool,
    vector: int = 0,
    tracing: PipelineTracer = NO_TRACING,
) -> tuple[float, pstats.Stats | None]:
    """(CPU s of ``Pipeline.run``, profile) for the pipeline over ``deliveries`` with the
    ``kind`` model's binding. The sink is opened before and closed after, outside the timed
    part. Raises ``AssertionError`` unless every delivery was acked. ``vector``: deliveries
    per vector (0: one at a time, as a source without vectors gives them). The budget is
    :data:`UNBOUNDED`: the run measures CPU, never waits for memory."""
    spec, binding = MODELS[kind], BINDINGS[kind]
    SINK_DEFAULTS = SqliteSinkSettings()  # noqa: N806 (a constant of this run)
    source = list_source(deliveries, vector)

    async def main() -> float:
        await sink.open(TABLES[kind])
        metrics = Metrics()
        pipe = Pipeline(
            source=source,
            sink=sink,
            decoder=MessageDecoder(binding.columns, check),
            model=model,
            settings=PipelineSettings(
                target_batch_size=max(spec.preferred_batch_sizes),
                max_wait_s=0.05,
                max_in_flight=2,
                output_bytes_per_row=1536,
                outputs=binding.outputs,
                passthrough=binding.passthrough,
                model_name=spec.name,
                model_version=spec.version,
                # The rest as the consumer's configuration defaults them:
                grace_s=ConsumerConfig.model_fields["shutdown_grace_s"].default,
                write_concurrency=SINK_DEFAULTS.write_concurrency,
                max_write_rows=SINK_DEFAULTS.max_write_rows,
                sink_backoff=SINK_DEFAULTS.backoff,
                commit_interval_s=IcebergSinkSettings.model_fields["commit_interval_s"].default,
            ),
            budget=ByteBudget(UNBOUNDED),
            telemetry=Telemetry(metrics, tracing=tracing),
            hooks=PipelineHooks(Gate(metrics)),
        )
        started = time.process_time()
        await pipe.run(asyncio.Event())
        spent = time.process_time() - started
        await sink.close()
        return spent

    with profiled(profile) as profilers:
        total = asyncio.run(main())
    if source.acked != len(deliveries):
        raise AssertionError(f"{source.acked} of {len(deliveries)} messages acked")
    stats = None
    if profilers:
        stats = pstats.Stats(profilers[0])
        stats.add(*profilers[1:])
    return total, stats
