"""Each default is declared once, in the settings type that owns it (issue 45): the engine's value
types declare none of the configured values, and the service builds them from the configuration,
so a default changed in a settings type is what the engine runs with."""

from __future__ import annotations

import dataclasses
from importlib.metadata import version
from typing import Any

import pytest

import rowbatch.consumer
from rowbatch.consumer.engine.decode import DecodeLimits
from rowbatch.consumer.engine.pipeline import PipelineSettings
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.observe.tracing_settings import TracingConfig
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import decode_limits, pipeline_settings
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.scaling_settings import ScalingInputs
from rowbatch.timing import Backoff
from rowbatch.tracing import TracingSettings

SPEC = ModelSpec(
    name="m",
    version="1",
    inputs=(TensorSpec("X", "FP32", (1,)),),
    outputs=(TensorSpec("Y", "FP32", (1,)),),
    max_batch_size=64,
    preferred_batch_sizes=(),
)
BINDING = Binding(inputs={"x": "X"}, outputs={"Y": "y"})
PUBSUB = {"kind": "pubsub", "subscription": "projects/p/subscriptions/sub"}
KAFKA = {"kind": "kafka", "bootstrap_servers": "b:9092", "topic": "t", "group_id": "g"}


def config(source: dict[str, Any] = PUBSUB, sink: dict[str, Any] | None = None) -> ConsumerConfig:
    fields: dict[str, Any] = {
        "source": source,
        "model": {"name": "m"},
        "binding": {"inputs": {"x": "X"}, "outputs": {"Y": "y"}},
    }
    if sink is not None:
        fields["sink"] = sink
    return ConsumerConfig.model_validate(fields)


def settings(cfg: ConsumerConfig) -> PipelineSettings:
    return pipeline_settings(
        cfg, BINDING, SPEC, target_batch_size=32, output_bytes_per_row=4, max_in_flight=2
    )


def default(model: type[Any], name: str) -> Any:
    """The default a pydantic settings type declares for ``name``."""
    return model.model_fields[name].default


def test_the_engine_value_types_declare_no_configured_default() -> None:
    configured = {"grace_s", "write_concurrency", "max_write_rows", "sink_backoff"}
    configured |= {"commit_interval_s"}
    fields = {f.name: f for f in dataclasses.fields(PipelineSettings)}
    for name in configured:
        assert fields[name].default is dataclasses.MISSING, name
        assert fields[name].default_factory is dataclasses.MISSING, name
    for field in dataclasses.fields(DecodeLimits):
        assert field.default is dataclasses.MISSING, field.name


def test_the_pipeline_runs_with_the_configuration_defaults() -> None:
    s = settings(config())
    assert s.grace_s == default(ConsumerConfig, "shutdown_grace_s")
    assert s.write_concurrency == default(SqliteSinkSettings, "write_concurrency")
    assert s.max_write_rows == default(SqliteSinkSettings, "max_write_rows")
    assert s.sink_backoff == Backoff(
        default(SqliteSinkSettings, "backoff_initial_s"),
        default(SqliteSinkSettings, "backoff_max_s"),
        jitter=s.sink_backoff.jitter,
    )
    assert s.commit_interval_s is None  # SQLite commits every write itself
    assert s.max_wait_s == default(type(config().model), "max_wait_ms") / 1000


ICEBERG = {"kind": "iceberg", "catalog_uri": "sqlite:///c.db", "warehouse": "file:///w"}


@pytest.mark.parametrize(
    ("sink", "fields"),
    [(ParquetSinkSettings, {"kind": "parquet", "url": "/tmp/t"}), (IcebergSinkSettings, ICEBERG)],
)
def test_a_committing_sink_s_commit_interval_reaches_the_pipeline(
    sink: type[Any], fields: dict[str, Any]
) -> None:
    assert settings(config(sink=fields)).commit_interval_s == default(sink, "commit_interval_s")
    configured = settings(config(sink=fields | {"commit_interval_s": 7.5}))
    assert configured.commit_interval_s == 7.5


def test_kafka_s_offset_commit_interval_is_not_the_sink_s() -> None:
    cfg = config(source=KAFKA | {"commit_interval_s": 2.5})
    assert isinstance(cfg.source, KafkaSettings) and cfg.source.commit_interval_s == 2.5
    assert settings(cfg).commit_interval_s is None
    pg = config(source=KAFKA, sink={"kind": "postgres", "dsn": "postgresql://h/db"})
    assert isinstance(pg.sink, PostgresSinkSettings)
    assert settings(pg).commit_interval_s is None


def test_configured_values_reach_the_pipeline() -> None:
    cfg = config(sink={"kind": "sqlite", "write_concurrency": 5, "max_write_rows": 77})
    s = settings(cfg)
    assert (s.write_concurrency, s.max_write_rows) == (5, 77)


def test_the_decoder_s_limits_are_the_configuration_s() -> None:
    assert decode_limits(config()) == DecodeLimits(
        default(ConsumerConfig, "max_message_bytes"),
        default(ConsumerConfig, "max_attributes_bytes"),
    )


def test_tracing_config_defaults_are_tracing_settings_defaults() -> None:
    assert TracingConfig().settings() == TracingSettings(default(TracingConfig, "service_name"))


def test_the_sources_share_one_declaration_of_the_scaling_inputs() -> None:
    for name in ScalingInputs.model_fields:
        for source in (KafkaSettings, PubSubSettings):
            assert source.model_fields[name] is ScalingInputs.model_fields[name] or (
                source.model_fields[name].default == default(ScalingInputs, name)
            )
        assert name not in KafkaSettings.__annotations__, name
        assert name not in PubSubSettings.__annotations__, name


def test_the_package_version_is_the_distribution_s() -> None:
    assert rowbatch.consumer.__version__ == version("rowbatch")
