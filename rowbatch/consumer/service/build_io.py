"""Building the configured parts: the source for the configured broker, the sink for the
configured store, and the result table's layout from the model's outputs; opening the sink
waits while it is unreachable."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from prometheus_client import CollectorRegistry

from rowbatch.consumer import __version__
from rowbatch.consumer.engine.decode import MessageDecoder, PoisonMessage
from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.model.settings import BindingSettings
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.scaling import ScalingSignal, SignalSettings
from rowbatch.consumer.service.config import ConsumerConfig, SinkSettings, SourceSettings
from rowbatch.consumer.service.startup import wait_for
from rowbatch.consumer.sinks.base import ColumnSpec, Sink, SinkUnavailable, TableSpec
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
)
from rowbatch.consumer.sources.base import Source, SourceUnreachable
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.scaling_settings import ScalingInputs
from rowbatch.consumer.sources.table.settings import TableSettings
from rowbatch.pubsub_env import project_of
from rowbatch.timing import SYSTEM_CLOCKS, Backoff, Clocks
from rowbatch.wire.columns.column_type import ColumnType

if TYPE_CHECKING:
    from rowbatch.consumer.sources.table.source import TableSource

_DATATYPE_DTYPES = {
    "FP32": "float32",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "BOOL": "bool",
    "BYTES": "object",
}


def scaling_signal(
    settings: SourceSettings, metrics: Metrics, *, slots_fill_server: bool = True
) -> ScalingSignal:
    """The autoscaling figure's settings from the ``[source]`` section, its gauges in
    ``metrics``: Kafka sees the group (``fleet``), Pub/Sub its own receipts (``share``).
    ``slots_fill_server``: the in-flight limit comes from the model's configuration (not
    ``model.max_in_flight``), so slots all busy mean a full server."""
    view: Literal["fleet", "share"] = "fleet" if isinstance(settings, KafkaSettings) else "share"
    if isinstance(settings, TableSettings):  # a table run is sized by its shards, not scaled
        return ScalingSignal(
            SignalSettings(view, 10.0, ScalingInputs(), slots_fill_server=slots_fill_server),
            metrics.scaling,
        )
    return ScalingSignal(
        SignalSettings(
            view, settings.target_latency_s, settings, slots_fill_server=slots_fill_server
        ),
        metrics.scaling,
    )


def make_source(
    settings: SourceSettings,
    metrics: Metrics | None = None,
    signal: ScalingSignal | None = None,
    budget_bytes: int | None = None,
) -> Source:
    """The configured source. ``metrics``: the consumer's metrics (the Kafka source exports
    its lag gauges in their registry; a dead letter a source sends on its own initiative is
    counted in ``rowbatch_messages_dead_lettered_total{reason}``, like the pipeline's).
    ``signal``: the consumer's scaling signal, which the Kafka source feeds with the group's
    backlog (default: one built from ``settings`` on ``metrics``). ``budget_bytes``: the
    consumer's budget, which bounds the Kafka client's fetches
    (:meth:`~rowbatch.consumer.sources.kafka.settings.KafkaSettings.within_budget`)."""
    registry: CollectorRegistry | None = None
    on_dead_letter: Callable[[DeadLetterReason], None] | None = None
    if metrics is not None:
        registry = metrics.registry
        counter = metrics.dead_lettered

        def on_dead_letter(reason: DeadLetterReason) -> None:
            counter.labels(reason.reason_class.value).inc()

    if isinstance(settings, TableSettings):
        raise TypeError("a table source is built by make_table_source (it needs the model)")
    if isinstance(settings, PubSubSettings) and settings.mode == "pull":
        from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource  # noqa: PLC0415

        return PubSubPullSource(
            settings, consumer_version=__version__, on_dead_letter=on_dead_letter
        )
    if isinstance(settings, PubSubSettings):
        from rowbatch.consumer.sources.pubsub.streaming import PubSubSource  # noqa: PLC0415

        return PubSubSource(settings, consumer_version=__version__, on_dead_letter=on_dead_letter)
    if isinstance(settings, KafkaShareSettings):
        from rowbatch.consumer.sources.kafka_share.source import KafkaShareSource  # noqa: PLC0415

        return KafkaShareSource(
            settings,
            consumer_version=__version__,
            on_dead_letter=on_dead_letter,
            registry=registry,
        )
    from rowbatch.consumer.sources.kafka.source import KafkaSource  # noqa: PLC0415

    if signal is None and metrics is not None:
        signal = scaling_signal(settings, metrics)
    if budget_bytes is not None:
        settings = settings.within_budget(budget_bytes)
    return KafkaSource(
        settings,
        consumer_version=__version__,
        registry=registry,
        on_dead_letter=on_dead_letter,
        signal=signal,
    )


def make_table_source(
    settings: TableSettings,
    spec: ModelSpec,
    binding: BindingSettings,
    decoder: MessageDecoder,
    metrics: Metrics | None = None,
    *,
    columns: tuple[str, ...] | None = None,
    prompt: Mapping[str, object] | None = None,
) -> TableSource:
    """The table source of an offline run: its progress is keyed by the model (name and
    version), the binding and, for a generative model, its ``prompt`` settings (templates,
    sampling: another prompt is another result); its first chunk is checked with ``decoder``
    at start-up. ``columns``: those read (default: the bound inputs and passthrough)."""
    from rowbatch.consumer.sources.table.source import TableModel, TableSource  # noqa: PLC0415

    def probe(delivery: Delivery) -> DeadLetterReason | None:
        try:
            decoder.rows(delivery)
        except PoisonMessage as exc:
            return exc.reason
        return None

    return TableSource(
        settings,
        model=TableModel(
            spec.name,
            spec.version,
            {**binding.model_dump(), **({"prompt": prompt} if prompt else {})},
        ),
        columns=columns if columns is not None else (*binding.inputs, *binding.passthrough),
        probe=probe,
        registry=metrics.registry if metrics is not None else None,
    )


def check_source_credentials(settings: SourceSettings) -> None:
    """Pub/Sub without the emulator: ``PubSubCredentialsError`` (a configuration error) when
    no Google credentials are found, so start-up says so at once instead of after waiting for
    the model server and the sink. Blocking (google-auth may ask the GCE metadata server)."""
    if isinstance(settings, PubSubSettings):
        from rowbatch.consumer.sources.pubsub.clients import check_credentials  # noqa: PLC0415

        check_credentials(project_of(settings.subscription))


def make_sink(settings: SinkSettings, registry: CollectorRegistry | None = None) -> Sink:
    """The configured sink (``registry``: where a sink with figures of its own exports them)."""
    if isinstance(settings, PostgresSinkSettings):
        from rowbatch.consumer.sinks.postgres.sink import PostgresSink  # noqa: PLC0415

        return PostgresSink(settings.dsn.get_secret_value(), schema=settings.db_schema)
    if isinstance(settings, ParquetSinkSettings):
        from rowbatch.consumer.sinks.parquet.sink import ParquetSink  # noqa: PLC0415

        return ParquetSink(settings.url, target_file_bytes=settings.target_file_bytes)
    if isinstance(settings, IcebergSinkSettings):
        return _iceberg_sink(settings, registry)
    from rowbatch.consumer.sinks.sqlite.sink import SqliteSink  # noqa: PLC0415

    return SqliteSink(settings.path)


def _iceberg_sink(settings: IcebergSinkSettings, registry: CollectorRegistry | None) -> Sink:
    from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog  # noqa: PLC0415
    from rowbatch.consumer.sinks.iceberg.sink import IcebergSink  # noqa: PLC0415

    def catalog() -> LedgerCatalog:
        return LedgerCatalog(
            settings.catalog_name,
            **{
                **settings.properties,
                "uri": settings.catalog_uri.get_secret_value(),
                "warehouse": settings.warehouse,
            },
        )

    return IcebergSink(
        catalog,
        namespace=settings.namespace,
        target_file_bytes=settings.target_file_bytes,
        registry=registry,
    )


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
    if config.sink.on_row_error == "error-row":  # the error rows' own columns
        outputs += [ColumnSpec(name, "object") for name in ERROR_COLUMNS]
    return TableSpec(config.sink.table, passthrough, tuple(outputs))


SOURCE_STARTUP_BACKOFF = Backoff(initial_s=1.0, max_s=30.0)
"""Waits between start-up checks of a broker that does not answer."""


async def open_source(
    source: Source,
    settings: SourceSettings,
    *,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> None:
    """``source.check()``, again with backoff while the broker does not answer
    (``SourceUnreachable``: a check that raises it can be called again), up to the source's
    ``startup_wait_s``: a broker that restarts with the consumer (a rollout, a node drain) is
    not a reason to exit. The source is closed if it cannot be opened."""
    try:
        await wait_for(
            source.check,
            what=f"source ({settings.kind})",
            unavailable=SourceUnreachable,
            wait_s=getattr(settings, "startup_wait_s", 0.0),
            backoff=SOURCE_STARTUP_BACKOFF,
            setting="source.startup_wait_s",
            clocks=clocks,
        )
    except BaseException:
        await source.close()
        raise


async def open_sink(
    sink: Sink,
    table: TableSpec,
    settings: SinkSettings,
    *,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> None:
    """``sink.open(table)``, waiting (with backoff, up to ``settings.startup_wait_s``) while the
    sink is unreachable: a database that restarts with the consumer is not a reason to exit."""
    await wait_for(
        lambda: sink.open(table),
        what=f"sink ({settings.kind})",
        unavailable=SinkUnavailable,
        wait_s=settings.startup_wait_s,
        backoff=settings.backoff,
        setting="sink.startup_wait_s",
        clocks=clocks,
    )
