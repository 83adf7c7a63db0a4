"""The ``[tracing]`` settings (docs/tracing.md): off unless ``enabled``; the fields left unset
defer to the standard ``OTEL_*`` variables, and ``OTEL_SDK_DISABLED=true`` turns it off."""

from __future__ import annotations

import os

from pydantic import Field

from rowbatch.consumer.section import Section
from rowbatch.tracing import Tracing, TracingSettings, start_tracing


class TracingConfig(Section):
    enabled: bool = False
    """Export spans (OpenTelemetry, OTLP over gRPC). Off: no exporter, no SDK loaded."""
    endpoint: str | None = None
    """The OTLP/gRPC collector, e.g. ``http://127.0.0.1:4317``; unset:
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, else
    ``http://localhost:4317``."""
    sample_ratio: float | None = Field(default=None, ge=0.0, le=1.0)
    """Parent-based sampling: a message's spans follow the producer's decision, traces that
    start here (inference requests, sink writes) are kept with this probability; unset:
    ``OTEL_TRACES_SAMPLER_ARG``, else 1.0."""
    service_name: str = "rowbatch-consumer"
    """``service.name`` of the spans (``OTEL_SERVICE_NAME`` wins)."""
    link_limit: int = Field(default=128, ge=1, le=10_000)
    """Most links a span carries: an inference request over more messages puts the rest on
    child spans."""

    def settings(self) -> TracingSettings:
        return TracingSettings(
            service_name=self.service_name,
            endpoint=self.endpoint,
            sample_ratio=self.sample_ratio,
            link_limit=self.link_limit,
        )


def start_consumer_tracing(config: TracingConfig) -> Tracing | None:
    """The SDK started when ``config.enabled`` (and ``OTEL_SDK_DISABLED`` is not ``true``)."""
    if not config.enabled or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    return start_tracing(config.settings())
