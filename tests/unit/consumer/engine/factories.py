"""Shared builders of the engine's value types for the unit tests: what a test does not set is
the consumer configuration's default, read from the settings type that declares it (so a
default changed there reaches these tests as it reaches the service)."""

from __future__ import annotations

from typing import Any

from rowbatch.consumer.engine.pipeline import PipelineSettings
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sinks.settings import IcebergSinkSettings, SqliteSinkSettings
from rowbatch.timing import Backoff

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
