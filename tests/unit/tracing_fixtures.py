"""The ``spans`` fixture: the OpenTelemetry SDK installed once per process as the global tracer
provider, every finished span kept in memory, and rowbatch's tracing switched on for the test.

Import it where it is used (``from tests.unit.tracing_fixtures import spans``), plus the helpers
that read finished spans without ``Optional`` noise."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

import rowbatch.tracing

__all__ = ["attrs", "context", "exporter", "named", "spans"]

_exporter: InMemorySpanExporter | None = None


def exporter() -> InMemorySpanExporter:
    """The in-memory exporter behind the global SDK provider, installed on the first call
    (OpenTelemetry refuses to replace a global provider, so this happens once a process)."""
    global _exporter  # noqa: PLW0603 (one provider a process)
    if _exporter is None:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "a tracer provider was already set"
        _exporter = memory
    return _exporter


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on (``rowbatch.tracing.active()``), the exporter emptied; yields it."""
    memory = exporter()
    monkeypatch.setattr(rowbatch.tracing, "_active", True)
    memory.clear()
    yield memory
    memory.clear()


def attrs(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes (empty when it has none)."""
    return dict(span.attributes or {})


def context(span: ReadableSpan) -> SpanContext:
    """The span's own context."""
    ctx: SpanContext | None = span.context
    assert ctx is not None
    return ctx


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """The finished spans called ``name``, in the order they ended."""
    return [s for s in finished if s.name == name]
