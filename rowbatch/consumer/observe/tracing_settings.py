"""The ``[tracing]`` settings (docs/tracing.md): off unless ``enabled``; the fields left unset
defer to the standard ``OTEL_*`` variables, and ``OTEL_SDK_DISABLED=true`` turns it off."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from pydantic import Field

from rowbatch.consumer.section import Section
from rowbatch.tracing import Tracing, TracingSettings, start_tracing

_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TracingSettings)}
"""The defaults of :class:`TracingSettings`, declared there only (the producer's tracing takes
the same type)."""


class TracingConfig(Section):
    """The fields of :class:`TracingSettings` (same names, same defaults; ``enabled`` and
    ``service_name``'s default are the consumer's own), validated as a config section."""

    enabled: bool = False
    """Export spans (OpenTelemetry, OTLP over gRPC). Off: no exporter, no SDK loaded."""
    endpoint: str | None = _DEFAULTS["endpoint"]
    """The OTLP/gRPC collector, e.g. ``http://127.0.0.1:4317``; unset:
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, else
    ``http://localhost:4317``."""
    sample_ratio: float | None = Field(default=_DEFAULTS["sample_ratio"], ge=0.0, le=1.0)
    """Parent-based sampling: a message's spans follow the producer's decision; a message
    that carries no trace context (its producer does not trace) starts a trace kept with this
    probability; unset: ``OTEL_TRACES_SAMPLER_ARG``, else 1.0."""
    batch_sample_ratio: float = Field(default=_DEFAULTS["batch_sample_ratio"], ge=0.0, le=1.0)
    """Inference requests (with their gRPC, backoff and isolation spans) and sink writes are
    kept when they carry a kept message (a write: a kept request); one that carries none is
    kept with this probability. 0: follow the messages."""
    service_name: str = "rowbatch-consumer"
    """``service.name`` of the spans (``OTEL_SERVICE_NAME`` wins)."""
    link_limit: int = Field(default=_DEFAULTS["link_limit"], ge=1, le=10_000)
    """Most links a span carries: an inference request over more messages puts the rest on
    child spans."""

    def settings(self) -> TracingSettings:
        return TracingSettings(**self.model_dump(exclude={"enabled"}))


def start_consumer_tracing(config: TracingConfig) -> Tracing | None:
    """The SDK started when ``config.enabled`` (and ``OTEL_SDK_DISABLED`` is not ``true``)."""
    if not config.enabled or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    return start_tracing(config.settings())
