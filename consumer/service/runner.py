"""Wiring: build the parts from the configuration, run the pipeline until a stop signal, close
everything. No logic of its own beyond start-up checks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numpy.typing import NDArray
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from consumer import __version__
from consumer.engine.batcher import Batch, Segment
from consumer.engine.budget import ByteBudget
from consumer.engine.intake import Intake, IntakeLimits
from consumer.engine.pipeline import Pipeline, PipelineSettings, RunBatch
from consumer.engine.poison import isolate
from consumer.engine.writer import SinkBackoff
from consumer.model.binding import (
    Binding,
    build_inputs,
    check_binding,
    check_chunk,
    memoized_check,
)
from consumer.model.discovery import (
    ModelServerUnavailable,
    ModelSpec,
    default_in_flight,
    output_bytes_per_row,
    target_batch_size,
)
from consumer.model.inference import (
    InferenceClient,
    PoisonInferenceError,
    RetryingInferencer,
    RetryPolicy,
    error_kind,
)
from consumer.model.mismatch import SchemaMismatch
from consumer.observe.metrics import Metrics
from consumer.service.config import (
    ConsumerConfig,
    KafkaSettings,
    ModelSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    PubSubSettings,
    SinkSettings,
    SourceSettings,
)
from consumer.service.health import HealthServer
from consumer.service.startup import StillUnavailable, wait_for
from consumer.sinks.base import ColumnSpec, Sink, SinkUnavailable, TableSpec
from consumer.sources.base import Source
from wire.chunks import DecodedChunk
from wire.columns import ColumnType

log = logging.getLogger(__name__)

_DATATYPE_DTYPES = {
    "FP32": "float32",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "BOOL": "bool",
    "BYTES": "object",
}


class StartupError(RuntimeError):
    """The consumer cannot start; the message says what to fix."""


@dataclass
class Running:
    """Handles a caller (the CLI, a test) can look at while the consumer runs."""

    metrics: Metrics
    health: HealthServer
    spec: ModelSpec
    target_batch_size: int
    ready: bool = False


def make_source(settings: SourceSettings, metrics: Metrics | None = None) -> Source:
    """The configured source. ``metrics``: the consumer's metrics (the Kafka source exports
    its lag gauges in their registry; a dead letter a source sends on its own initiative is
    counted in ``rowbatch_messages_dead_lettered_total{reason}``, like the pipeline's)."""
    from consumer.sources.base import DeadLetterReason  # noqa: PLC0415

    registry: CollectorRegistry | None = None
    on_dead_letter: Callable[[DeadLetterReason], None] | None = None
    if metrics is not None:
        registry = metrics.registry
        counter = metrics.dead_lettered

        def on_dead_letter(reason: DeadLetterReason) -> None:
            counter.labels(reason.reason_class.value).inc()

    if isinstance(settings, PubSubSettings) and settings.mode == "pull":
        from consumer.sources.pubsub.pull import (  # noqa: PLC0415
            PubSubPullSource,
            PubSubPullSourceConfig,
        )

        return PubSubPullSource(
            PubSubPullSourceConfig(
                subscription=settings.subscription,
                dead_letter_topic=settings.dead_letter_topic,
                max_messages=settings.max_messages,
                max_bytes=settings.max_bytes,
                max_lease_duration_s=settings.max_lease_duration_s,
                lease_extension_s=settings.max_lease_extension_s,
                max_delivery_attempts=settings.max_delivery_attempts,
                consumer_version=__version__,
                pull_concurrency=settings.pull_concurrency,
                pull_max_messages=settings.pull_max_messages,
                ack_delay_s=settings.ack_delay_ms / 1000,
            ),
            on_dead_letter=on_dead_letter,
        )
    if isinstance(settings, PubSubSettings):
        from consumer.sources.pubsub.streaming import PubSubSource, PubSubSourceConfig  # noqa: PLC0415

        return PubSubSource(
            PubSubSourceConfig(
                subscription=settings.subscription,
                dead_letter_topic=settings.dead_letter_topic,
                max_messages=settings.max_messages,
                max_bytes=settings.max_bytes,
                max_lease_duration_s=settings.max_lease_duration_s,
                max_lease_extension_s=settings.max_lease_extension_s,
                max_delivery_attempts=settings.max_delivery_attempts,
                consumer_version=__version__,
            ),
            on_dead_letter=on_dead_letter,
        )
    assert isinstance(settings, KafkaSettings)
    from consumer.sources.kafka.source import (  # noqa: PLC0415
        KafkaConfigError,
        KafkaSource,
        KafkaSourceConfig,
    )

    def secret(value: SecretStr | None) -> str | None:
        return None if value is None else value.get_secret_value()

    def path(value: Path | None) -> str | None:
        return None if value is None else str(value)

    try:
        config = KafkaSourceConfig(
            bootstrap_servers=settings.bootstrap_servers,
            topic=settings.topic,
            group_id=settings.group_id,
            dead_letter_topic=settings.dead_letter_topic,
            max_delivery_attempts=settings.max_delivery_attempts,
            redelivery_backoff_s=settings.redelivery_backoff_s,
            redelivery_backoff_max_s=settings.redelivery_backoff_max_s,
            commit_interval_s=settings.commit_interval_s,
            revoke_grace_s=settings.revoke_grace_s,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            rebalance_timeout_ms=settings.rebalance_timeout_ms,
            auto_offset_reset=settings.auto_offset_reset,
            max_buffered_records=settings.max_buffered_records,
            max_buffered_bytes=settings.max_buffered_bytes,
            max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
            security_protocol=settings.security_protocol,
            sasl_mechanism=settings.sasl_mechanism,
            sasl_plain_username=settings.sasl_plain_username,
            sasl_plain_password=secret(settings.sasl_plain_password),
            ssl_cafile=path(settings.ssl_cafile),
            ssl_certfile=path(settings.ssl_certfile),
            ssl_keyfile=path(settings.ssl_keyfile),
            ssl_key_password=secret(settings.ssl_key_password),
            client_id=settings.client_id,
            consumer_version=__version__,
            lag_interval_s=settings.lag_interval_s,
            target_latency_s=settings.target_latency_s,
            rows_per_s_per_replica=settings.rows_per_s_per_replica,
        )
    except KafkaConfigError as exc:
        raise StartupError(f"source (kafka): {exc}") from exc
    return KafkaSource(config, registry=registry, on_dead_letter=on_dead_letter)


def make_sink(settings: SinkSettings) -> Sink:
    if isinstance(settings, PostgresSinkSettings):
        from consumer.sinks.postgres import PostgresSink  # noqa: PLC0415

        return PostgresSink(settings.dsn.get_secret_value(), schema=settings.db_schema)
    if isinstance(settings, ParquetSinkSettings):
        from consumer.sinks.parquet import ParquetSink  # noqa: PLC0415

        return ParquetSink(settings.url)
    from consumer.sinks.sqlite import SqliteSink  # noqa: PLC0415

    return SqliteSink(settings.path)


def _column_spec(name: str, ctype: ColumnType) -> ColumnSpec:
    """The result column of a passthrough column: text is ``object`` (PostgreSQL ``text``),
    raw bytes ``bytes`` (``bytea``, SQLite BLOB, Parquet binary), numbers keep their dtype."""
    kind = ctype.kind.value
    dtype = "object" if kind == "string" else "bytes" if kind == "bytes" else str(ctype.numpy_dtype)
    return ColumnSpec(name, dtype, ctype.dim or 0)


def table_spec(config: ConsumerConfig, spec: ModelSpec) -> TableSpec:
    passthrough = tuple(
        _column_spec(name, ColumnType.parse(text))
        for name, text in config.binding.passthrough.items()
    )
    outputs = []
    for out_name, column in config.binding.outputs.items():
        tensor = spec.output(out_name)
        assert tensor is not None  # check_binding saw it
        dims = [d for d in tensor.dims if d != 1] or [0]
        outputs.append(ColumnSpec(column, _DATATYPE_DTYPES[tensor.datatype], dims[0]))
    return TableSpec(config.sink.table, passthrough, tuple(outputs))


async def open_sink(
    sink: Sink,
    table: TableSpec,
    settings: SinkSettings,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """``sink.open(table)``, waiting (with backoff, up to ``settings.startup_wait_s``) while the
    sink is unreachable: a database that restarts with the consumer is not a reason to exit."""
    try:
        await wait_for(
            lambda: sink.open(table),
            what=f"sink ({settings.kind})",
            unavailable=SinkUnavailable,
            wait_s=settings.startup_wait_s,
            backoff=SinkBackoff(settings.backoff_initial_s, settings.backoff_max_s),
            setting="sink.startup_wait_s",
            sleep=sleep,
            clock=clock,
        )
    except StillUnavailable as exc:
        raise StartupError(str(exc)) from exc


async def discover_model_waiting(
    client: InferenceClient,
    settings: ModelSettings,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ModelSpec:
    """The model's spec, waiting (with backoff, up to ``model.startup_wait_s``) while the
    inference server does not answer; an unknown model or a failed TLS handshake fails at
    once."""
    try:
        return await wait_for(
            client.discover,
            what=f"inference server {settings.url}",
            unavailable=ModelServerUnavailable,
            wait_s=settings.startup_wait_s,
            backoff=SinkBackoff(settings.backoff_initial_s, settings.backoff_max_s),
            setting="model.startup_wait_s",
            sleep=sleep,
            clock=clock,
        )
    except StillUnavailable as exc:
        raise StartupError(str(exc)) from exc


def make_check(
    spec: ModelSpec, binding: Binding, passthrough: Mapping[str, ColumnType]
) -> Callable[[DecodedChunk], None]:
    """Per-message check: bound columns fit the model, passthrough columns have their type.
    The type checks run once per column signature (``memoized_check``)."""

    def check(chunk: DecodedChunk) -> None:
        missing = [c for c in binding.columns if c not in chunk.columns]
        if missing:
            raise SchemaMismatch(
                f"chunk of table {chunk.table!r} lacks column(s) {missing}; "
                f"it has {sorted(chunk.columns)}",
                column=missing[0],
                expected="present",
                found="absent",
                code="missing_column",
            )
        for name, want in passthrough.items():
            got = chunk.types[name]
            if got != want:
                raise SchemaMismatch(
                    f"passthrough column {name!r} is {got}, configured as {want}",
                    column=name,
                    expected=str(want),
                    found=str(got),
                )
        check_chunk(spec, binding, {name: chunk.column(name) for name in binding.columns})

    return memoized_check(spec, binding, check, tuple(passthrough))


def make_run_batch(inferencer: RetryingInferencer, spec: ModelSpec, binding: Binding) -> RunBatch:
    """Tensor building plus inference; outputs come back as result columns want them: one
    value per row for single-element outputs, ``rows x n`` for vectors."""
    outputs = list(binding.outputs)

    async def run(batch: Batch) -> Mapping[str, NDArray[Any]]:
        inputs = build_inputs(spec, binding, batch.columns, batch.nulls)
        answer = await inferencer.infer(inputs, outputs)
        rows = len(batch)
        return {
            name: a.reshape(rows) if a.size == rows else a.reshape(rows, -1)
            for name, a in answer.items()
        }

    return run


def is_poison(exc: BaseException) -> bool:
    return isinstance(exc, PoisonInferenceError)


async def isolate_batch(
    batch: Batch, run: RunBatch
) -> tuple[list[tuple[Batch, Mapping[str, NDArray[Any]]]], list[tuple[Segment, BaseException]]]:
    found = await isolate(list(batch.segments), lambda segs: run(batch.select(segs)), is_poison)
    return [(batch.select(segs), out) for segs, out in found.good], found.bad


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
    binding = Binding(
        inputs=config.binding.inputs,
        outputs=config.binding.outputs,
        passthrough=tuple(config.binding.passthrough),
    )
    passthrough_types = {k: ColumnType.parse(v) for k, v in config.binding.passthrough.items()}
    client = InferenceClient(
        config.model.url, config.model.name, config.model.version, tls=config.model.tls_options()
    )
    try:
        spec = await discover_model_waiting(client, config.model)
        check_binding(spec, binding)
        target = target_batch_size(spec, config.model.batch_size)
        in_flight = config.model.max_in_flight or default_in_flight(spec, target)
        metrics = Metrics()
        health = HealthServer(
            metrics.registry, lambda: running.ready, config.server.host, config.server.port
        )
        running = Running(metrics, health, spec, target)
        sink = sink or make_sink(config.sink)
        await open_sink(sink, table_spec(config, spec), config.sink)
        source = source or make_source(config.source, metrics)
        await source.check()
        pipeline: Pipeline
        inferencer = RetryingInferencer(
            client,
            RetryPolicy(
                initial_backoff_s=config.model.backoff_initial_s,
                max_backoff_s=config.model.backoff_max_s,
                client_timeout_s=config.model.timeout_s,
            ),
            on_backoff_start=lambda: pipeline.backoff_started(),  # noqa: PLW0108 (bound later)
            on_backoff_end=lambda: pipeline.backoff_ended(),  # noqa: PLW0108
            on_error=lambda exc: metrics.inference_errors.labels(error_kind(exc)).inc(),
            probe=client.ready,
        )
        pipeline = Pipeline(
            source=source,
            sink=sink,
            intake=Intake(
                binding.columns,
                make_check(spec, binding, passthrough_types),
                getattr(config.source, "max_delivery_attempts", None),
                IntakeLimits(config.max_message_bytes, config.max_attributes_bytes),
            ),
            run_batch=make_run_batch(inferencer, spec, binding),
            isolate=isolate_batch,
            is_poison=is_poison,
            settings=PipelineSettings(
                target_batch_size=target,
                max_wait_s=config.model.max_wait_ms / 1000,
                max_in_flight=in_flight,
                output_bytes_per_row=output_bytes_per_row(spec),
                outputs=binding.outputs,
                passthrough=binding.passthrough,
                model_name=spec.name,
                model_version=spec.version,
                grace_s=config.shutdown_grace_s,
                write_concurrency=config.sink.write_concurrency,
                max_write_rows=config.sink.max_write_rows,
                sink_backoff=SinkBackoff(config.sink.backoff_initial_s, config.sink.backoff_max_s),
            ),
            budget=ByteBudget(config.budget_bytes),
            metrics=metrics,
        )
        await health.start()
        log.info(
            "consuming: model %s v%s, batch size %d, %d in flight, budget %d bytes",
            spec.name,
            spec.version or "?",
            target,
            in_flight,
            config.budget_bytes,
        )
        running.ready = True
        if on_running is not None:
            on_running(running)
        try:
            await pipeline.run(stop)
        finally:
            running.ready = False
            await source.close()
            await sink.close()
            await health.close()
    finally:
        await client.close()
