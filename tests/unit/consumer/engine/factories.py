"""Shared builders of the engine's value types and pipelines for the unit tests: what a test does
not set is the consumer configuration's default, read from the settings type that declares it
(so a default changed there reaches these tests as it reaches the service)."""

from __future__ import annotations

from typing import Any

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.decode import MessageDecoder
from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.pipeline import Pipeline, PipelineHooks, PipelineSettings
from rowbatch.consumer.engine.rollout_hooks import Rollout
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sinks.base import Sink
from rowbatch.consumer.sinks.settings import IcebergSinkSettings, SqliteSinkSettings
from rowbatch.consumer.sources.base import Source
from rowbatch.timing import SYSTEM_CLOCKS, Backoff, Clocks
from rowbatch.wire.chunks.decode import DecodedChunk

SINK_DEFAULTS = SqliteSinkSettings()
"""A ``[sink]`` section left to its defaults (those of every sink kind)."""


def sink_backoff() -> Backoff:
    """The configured sink backoff's default."""
    return SINK_DEFAULTS.backoff


def pipeline_settings(**fields: Any) -> PipelineSettings:
    """``PipelineSettings`` with ``fields``; the rest: a one-output model ``m`` v1 (``Y`` ->
    ``y``, 8 bytes a row, no passthrough) and the configuration's defaults."""
    base: dict[str, Any] = {
        "output_bytes_per_row": 8,
        "outputs": {"Y": "y"},
        "passthrough": (),
        "model_name": "m",
        "model_version": "1",
        "grace_s": ConsumerConfig.model_fields["shutdown_grace_s"].default,
        "write_concurrency": SINK_DEFAULTS.write_concurrency,
        "max_write_rows": SINK_DEFAULTS.max_write_rows,
        "sink_backoff": SINK_DEFAULTS.backoff,
        "commit_interval_s": IcebergSinkSettings.model_fields["commit_interval_s"].default,
    }
    return PipelineSettings(**(base | fields))


def _no_check(chunk: DecodedChunk) -> None:
    pass


def make_pipeline(
    source: Source,
    sink: Sink,
    model: ModelHandler,
    *,
    budget: ByteBudget | int = 10_000_000,
    metrics: Metrics | None = None,
    decoder: MessageDecoder | None = None,
    telemetry: Telemetry | None = None,
    clocks: Clocks = SYSTEM_CLOCKS,
    rollout: Rollout | None = None,
    **settings: Any,
) -> Pipeline:
    """A ``Pipeline`` from ``source`` to ``sink`` through ``model``, with the settings of
    :func:`pipeline_settings` (``settings`` override them), a budget of ``budget`` bytes (or
    that ``ByteBudget``), a decoder of column ``x`` that checks nothing unless ``decoder`` is
    given, and ``telemetry`` (default: ``metrics``, or fresh ones, no signal, no tracing). Its
    gate reports to the telemetry's metrics; ``clocks``: its time; ``rollout``: a candidate
    model beside ``model``."""
    if telemetry is None:
        telemetry = Telemetry(metrics or Metrics())
    return Pipeline(
        source=source,
        sink=sink,
        decoder=decoder or MessageDecoder(("x",), _no_check),
        model=model,
        settings=pipeline_settings(**settings),
        budget=budget if isinstance(budget, ByteBudget) else ByteBudget(budget),
        telemetry=telemetry,
        hooks=PipelineHooks(Gate(telemetry.metrics), clocks=clocks, rollout=rollout),
    )
