"""Wiring: build the parts from the configuration, run the pipeline until a stop signal, close
everything. No logic of its own beyond start-up checks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.decode import DecodeLimits, MessageDecoder
from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.pipeline import Pipeline, PipelineHooks, PipelineSettings
from rowbatch.consumer.engine.stage_context import Telemetry
from rowbatch.consumer.model.admission import AdmissionSettings
from rowbatch.consumer.model.balancer import Balancer
from rowbatch.consumer.model.binding import (
    Binding,
    check_binding,
)
from rowbatch.consumer.model.endpoints import Membership
from rowbatch.consumer.model.handler import ModelHandler, OipHandler
from rowbatch.consumer.model.inference.errors import error_kind
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.server_kind import target_batch_size
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.spec_match import same_spec
from rowbatch.consumer.observe.memory import trim
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.scaling import ScalingSignal
from rowbatch.consumer.observe.tracing import NO_TRACING, SYSTEMS, PipelineTracer, PipelineTracing
from rowbatch.consumer.service.build_io import (
    make_sink,
    make_source,
    make_table_source,
    open_sink,
    open_source,
    scaling_signal,
    table_spec,
)
from rowbatch.consumer.service.build_model import (
    connector,
    discover_endpoints_waiting,
    health_timing,
    per_endpoint_limit,
)
from rowbatch.consumer.service.build_openai import open_openai
from rowbatch.consumer.service.build_rollout import CandidateModel, RolloutSide, open_rollout
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.gc_tuning import tune_gc
from rowbatch.consumer.service.health import HealthServer
from rowbatch.consumer.service.shutdown import (
    CLOSE_STEP_S,
    SOURCE_CLOSE_S,
    StoppedDuringStartup,
    close_bounded,
    unless_stopped,
)
from rowbatch.consumer.sinks.base import Sink
from rowbatch.consumer.sinks.settings import IcebergSinkSettings, ParquetSinkSettings
from rowbatch.consumer.sources.base import Source
from rowbatch.consumer.sources.table.settings import TableSettings, table_write_rows
from rowbatch.tracing import active as tracing_active
from rowbatch.wire.columns.column_type import ColumnType

log = logging.getLogger(__name__)

__all__ = ["Running", "decode_limits", "pipeline_settings", "pipeline_tracing", "run_consumer"]


def pipeline_settings(
    config: ConsumerConfig,
    binding: Binding,
    spec: ModelSpec,
    *,
    target_batch_size: int,
    output_bytes_per_row: int,
    max_in_flight: int,
) -> PipelineSettings:
    """The pipeline's settings: the configured values (whose settings types declare the
    defaults; ``PipelineSettings`` declares none of them) and what start-up found out about the
    model."""
    sink = config.sink
    max_write_rows = sink.max_write_rows
    if not max_write_rows and isinstance(config.source, TableSettings):
        max_write_rows = table_write_rows(target_batch_size, max_in_flight, sink.write_concurrency)
    return PipelineSettings(
        target_batch_size=target_batch_size,
        max_wait_s=config.model.max_wait_ms / 1000,
        max_in_flight=max_in_flight,
        output_bytes_per_row=output_bytes_per_row,
        outputs=binding.outputs,
        passthrough=binding.passthrough,
        model_name=spec.name,
        model_version=spec.version,
        grace_s=config.shutdown_grace_s,
        write_concurrency=sink.write_concurrency,
        max_write_rows=max_write_rows,
        sink_backoff=sink.backoff,
        serial_isolation=not (
            isinstance(config.model, ModelSettings) and config.model.isolation == "concurrent"
        ),
        error_rows=(table_spec(config, spec).outputs if sink.on_row_error == "error-row" else None),
        commit_interval_s=(
            sink.commit_interval_s
            if isinstance(sink, ParquetSinkSettings | IcebergSinkSettings)
            else None
        ),
    )


def decode_limits(config: ConsumerConfig) -> DecodeLimits:
    """The decoder's size limits, as configured."""
    return DecodeLimits(config.max_message_bytes, config.max_attributes_bytes)


def pipeline_tracing(config: ConsumerConfig, model: str) -> PipelineTracer:
    """The pipeline's spans when this process started tracing (the CLI, from ``[tracing]``);
    ``NO_TRACING`` when it did not."""
    if not tracing_active():
        return NO_TRACING
    return PipelineTracing(
        system=SYSTEMS[config.source.kind],
        model=model,
        sink=config.sink.kind,
        link_limit=config.tracing.link_limit,
    )


@dataclass
class Running:
    """Handles a caller (the CLI, a test) can look at while the consumer runs."""

    metrics: Metrics
    health: HealthServer
    spec: ModelSpec
    target_batch_size: int
    ready: bool = False
    balancer: Balancer | None = None
    """The model-server endpoints and their state."""
    source: Source | None = None
    """Set once built (a table run's counts are on its ``TableSource``)."""
    model_work_at_risk: int = 0
    """Most rows of model work a kill can throw away (answered, not yet made durable): set
    once the pipeline is built (:attr:`PipelineSettings.model_work_at_risk`)."""


async def _checked_source(
    config: ConsumerConfig,
    source: Source | None,
    *,
    spec: ModelSpec,
    columns: tuple[str, ...],
    decoder: MessageDecoder,
    metrics: Metrics,
    signal: ScalingSignal | None,
    stop: asyncio.Event,
) -> Source:
    """The source the run reads, checked: ``source`` (tests) or a table source checked once;
    the configured broker's waited for (made and checked again, with backoff) while it does
    not answer."""
    if source is None and isinstance(config.source, TableSettings):
        model = config.model
        prompt = (
            model.model_dump(
                include={"api", "prompt", "system_prompt", "max_tokens", "temperature"}
                | {"sampling", "json_schema"},
                mode="json",
            )
            if isinstance(model, OpenAISettings)
            else None
        )
        source = make_table_source(
            config.source, spec, config.binding, decoder, metrics, columns=columns, prompt=prompt
        )
    if source is not None:
        await source.check()
        return source
    source = make_source(config.source, metrics, signal, config.budget_bytes)
    await unless_stopped(open_source(source, config.source), stop)
    return source


@dataclass
class ModelSide:
    """The model as start-up found it, whatever the server kind."""

    spec: ModelSpec
    handler: ModelHandler
    binding: Binding
    in_flight: int
    """Batches in flight at once."""
    slots_fill_server: bool
    """The in-flight limit comes from the server (not ``model.max_in_flight``)."""
    close: Callable[[], Awaitable[None]]
    balancer: Balancer | None = None
    saturated: Callable[[], bool] = lambda: False
    """Whether every server runs full with requests waiting (the servers limit the flow)."""


async def _open_oip(
    config: ConsumerConfig,
    settings: ModelSettings,
    passthrough: Mapping[str, ColumnType],
    metrics: Metrics,
    gate: Gate,
) -> ModelSide:
    """An Open Inference Protocol model: its endpoints discovered (waiting while none
    answers), the binding checked, the retrying handler (the balancer closed on failure)."""
    binding = Binding(
        inputs=config.binding.inputs,
        outputs=config.binding.outputs,
        passthrough=tuple(config.binding.passthrough),
    )
    membership = Membership(settings.endpoints())
    balancer = Balancer(
        settings.name,
        connector(settings, membership),
        meter=metrics.endpoint,
        on_error=lambda exc: metrics.inference_errors.labels(error_kind(exc)).inc(),
        timing=health_timing(settings),
        admission=AdmissionSettings(settings.adapt_interval_s, settings.target_queue_ratio)
        if settings.adapt
        else None,
    )
    try:
        specs = await discover_endpoints_waiting(balancer, membership, settings)
        spec = same_spec(specs)
        check_binding(spec, binding)
        target = target_batch_size(spec, settings.batch_size)
        balancer.start(spec, per_endpoint_limit(settings, target), specs)
        if membership.endpoints.dynamic:
            balancer.follow(membership.addresses, settings.resolve_interval_s)
    except BaseException:
        await close_bounded("inference clients", balancer.close(), CLOSE_STEP_S)
        raise
    inferencer = RetryingInferencer(  # backs off only when no endpoint is left to try
        balancer,
        InferenceRetry(settings.backoff, client_timeout_s=settings.timeout_s),
        on_backoff_start=gate.backoff_started,
        on_backoff_end=gate.backoff_ended,
        probe=balancer.any_healthy,
    )
    handler = OipHandler(inferencer, spec, binding, passthrough, target)
    return ModelSide(
        spec,
        handler,
        binding,
        balancer.capacity,
        settings.max_in_flight is None,
        balancer.close,
        balancer,
        lambda: balancer.saturated,
    )


async def _open_model(
    config: ConsumerConfig, passthrough: Mapping[str, ColumnType], metrics: Metrics, gate: Gate
) -> ModelSide:
    settings = config.model
    if isinstance(settings, ModelSettings):
        return await _open_oip(config, settings, passthrough, metrics, gate)
    model = await open_openai(settings, config.binding, passthrough, metrics=metrics, gate=gate)
    return ModelSide(
        model.spec,
        model.handler,
        model.binding,
        model.batches_in_flight,
        True,
        model.pool.close,
        saturated=lambda: model.pool.saturated,
    )


def _describe_model(model: ModelSide, config: ConsumerConfig) -> str:
    spec = model.spec
    head = f"model {spec.name} v{spec.version or ' as each answer names it'} on {spec.server}"
    if model.balancer is not None:
        limits = ", ".join(f"{ep.address}: {ep.limit}" for ep in model.balancer.endpoints)
        return (
            f"{head} (spec from {spec.source}), batch size "
            f"{model.handler.target_batch_size}, {model.in_flight} in flight ({limits})"
        )
    settings = config.model
    assert isinstance(settings, OpenAISettings)
    return (
        f"{head} over {settings.api}, {settings.requests_rows} row(s) per request, windows of "
        f"{settings.max_in_flight} requests per endpoint (up to {settings.window_ceiling}"
        f"{', following the server queue' if settings.adapt else ''}), batches of "
        f"{model.handler.target_batch_size} rows, {model.in_flight} in flight"
    )


async def run_consumer(
    config: ConsumerConfig,
    stop: asyncio.Event,
    *,
    source: Source | None = None,
    sink: Sink | None = None,
    on_running: Callable[[Running], None] | None = None,
) -> None:
    """Run until ``stop`` is set (or the source ends). ``source``/``sink`` replace the
    configured ones (tests)."""
    passthrough_types = {k: ColumnType.parse(v) for k, v in config.binding.passthrough.items()}
    metrics = Metrics()
    running: Running | None = None
    # Served from the start: /healthz answers (alive) while start-up waits for the model
    # server and the sink, /readyz only once consuming.
    health = HealthServer(
        metrics.registry,
        lambda: running is not None and running.ready,
        config.server.host,
        config.server.port,
    )
    await health.start()
    # Closed while the model's retries (or the sink's) back off: intake waits, the source
    # is paused. Made before the retries, which close it, and given to the pipeline.
    gate = Gate(metrics)
    model: ModelSide | None = None
    rollout: RolloutSide | None = None
    try:
        model = await unless_stopped(_open_model(config, passthrough_types, metrics, gate), stop)
        spec, handler, binding = model.spec, model.handler, model.binding
        target = handler.target_batch_size
        running = Running(metrics, health, spec, target, balancer=model.balancer)

        async def open_candidate(cfg: ConsumerConfig, own: Gate, apart: Metrics) -> CandidateModel:
            side = await _open_model(cfg, passthrough_types, apart, own)
            return CandidateModel(side.spec, side.handler, side.in_flight, side.close)

        rollout = await unless_stopped(
            open_rollout(config, spec, open_model=open_candidate, gate=gate, metrics=metrics),
            stop,
        )
        sink = sink or make_sink(config.sink, metrics.registry)
        await unless_stopped(open_sink(sink, table_spec(config, spec), config.sink), stop)
        signal = scaling_signal(config.source, metrics, slots_fill_server=model.slots_fill_server)
        decoder = MessageDecoder(
            binding.columns,
            handler.check,
            getattr(config.source, "max_delivery_attempts", None),
            decode_limits(config),
        )
        source = await _checked_source(
            config,
            source,
            spec=spec,
            columns=binding.columns,
            decoder=decoder,
            metrics=metrics,
            signal=signal,
            stop=stop,
        )
        running.source = source
        settings = pipeline_settings(
            config,
            binding,
            spec,
            target_batch_size=handler.target_batch_size,
            output_bytes_per_row=handler.output_bytes_per_row,
            max_in_flight=model.in_flight,
        )
        running.model_work_at_risk = settings.model_work_at_risk
        pipeline = Pipeline(
            source=source,
            sink=sink,
            decoder=decoder,
            model=handler,
            settings=settings,
            budget=ByteBudget(config.budget_bytes - (rollout.budget_bytes if rollout else 0)),
            telemetry=Telemetry(metrics, signal, pipeline_tracing(config, spec.name)),
            hooks=PipelineHooks(
                gate,
                trim=trim,
                server_saturated=model.saturated,
                rollout=None if rollout is None else rollout.rollout,
            ),
        )
        log.info(
            "consuming: %s, budget %d bytes; a kill costs at most %d rows of model work",
            _describe_model(model, config),
            config.budget_bytes,
            settings.model_work_at_risk,
        )
        if rollout is not None:
            log.info("rolling out: %s", rollout.describe)
            rollout.start()
        tune_gc()
        running.ready = True
        if on_running is not None:
            on_running(running)
        try:
            await pipeline.run(stop)
        finally:
            running.ready = False
            await close_bounded("source", source.close(), SOURCE_CLOSE_S)
            await close_bounded("sink", sink.close(), CLOSE_STEP_S)
    except StoppedDuringStartup:
        log.info("stopped during start-up, before consuming anything")
    finally:
        if rollout is not None:
            await close_bounded("candidate model", rollout.close(), CLOSE_STEP_S)
        if model is not None:
            await close_bounded("inference clients", model.close(), CLOSE_STEP_S)
        await close_bounded("health server", health.close(), CLOSE_STEP_S)
