"""OpenTelemetry tracing shared by the producer and the consumer: turning it on (the SDK with
an OTLP exporter and a parent-based sampler, :func:`sampler`), and carrying W3C trace context
in a message's attributes (Pub/Sub) or headers (Kafka).

Off by default and free when off: nothing here starts an exporter or a thread until
:func:`start_tracing` is called, and the hot paths ask :func:`active` (a module flag) before
touching the OpenTelemetry API at all.

Context in messages (docs/tracing.md):

- Kafka headers carry ``traceparent`` (and ``tracestate``), the W3C names;
- Pub/Sub attributes carry ``googclient_traceparent`` (and ``googclient_tracestate``), what
  Google's own Pub/Sub client writes and reads when its OpenTelemetry tracing is on, so a
  message published by either client is linked by either subscriber.

A consumer reads whichever of the two it finds (``googclient_`` first), whatever the broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = [
    "FOLLOWS_LINKS",
    "PUBSUB_PREFIX",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_CONTEXT_BYTES",
    "Tracing",
    "TracingError",
    "TracingSettings",
    "active",
    "context_of",
    "inject",
    "linked_or_ratio",
    "sampler",
    "start_tracing",
    "traceparent_of",
]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACE_CONTEXT_BYTES: Final = 256
"""What the context written into a message may take (names and values): publishers keep this
much of a message's size limit free for it, whether tracing is on or not."""
PUBSUB_PREFIX: Final = "googclient_"
"""What Google's Pub/Sub client puts before the W3C names in message attributes."""
FOLLOWS_LINKS: Final = "rowbatch.links"
"""The attribute of a span over messages or requests (an ``infer`` span, a ``write`` span): how
many contexts it links. Such a root is sampled by what it links (:func:`linked_or_ratio`): kept
when a link is sampled, else with the batch ratio, never with the ratio of other roots."""

_active = False


def active() -> bool:
    """Whether :func:`start_tracing` configured the SDK in this process (hot paths ask first)."""
    return _active


class TracingError(ValueError):
    """The tracing settings cannot work (named in the message)."""


@dataclass(frozen=True)
class TracingSettings:
    """How spans are sampled and where they go. ``None`` fields leave the choice to the
    standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_SERVICE_NAME``), then
    to the SDK's defaults (``http://localhost:4317``, ratio 1.0)."""

    service_name: str
    endpoint: str | None = None
    """OTLP over gRPC, e.g. ``http://127.0.0.1:4317`` (``https://`` for TLS)."""
    sample_ratio: float | None = None
    """Parent-based: a message's spans follow its producer's decision; a trace started here
    (a producer's ``send``, a consumed message that carries no trace context) is kept with this
    probability."""
    batch_sample_ratio: float = 0.0
    """The probability that a span over messages (an inference request and its children, a
    sink write) linking no sampled context is kept anyway. 0: follow the messages (a request
    is kept only when it carries a sampled message, a write only when it writes a kept
    request)."""
    link_limit: int = 128
    """Most links one span carries (the SDK's ``OTEL_SPAN_LINK_COUNT_LIMIT`` default); an
    inference span over more messages puts the rest on child spans."""
    export_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.sample_ratio is not None and not 0.0 <= self.sample_ratio <= 1.0:
            raise TracingError(f"tracing sample ratio must be in [0, 1], not {self.sample_ratio}")
        if not 0.0 <= self.batch_sample_ratio <= 1.0:
            raise TracingError(
                f"tracing batch sample ratio must be in [0, 1], not {self.batch_sample_ratio}"
            )
        if self.link_limit < 1:
            raise TracingError(f"tracing link limit must be >= 1, not {self.link_limit}")


class Tracing:
    """The SDK as started by :func:`start_tracing`; ``shutdown`` flushes what is buffered."""

    def __init__(self, provider: Any, settings: TracingSettings) -> None:
        self.provider = provider
        self.settings = settings

    def shutdown(self) -> None:
        """Export what is buffered (bounded by the exporter's timeout) and stop."""
        global _active  # noqa: PLW0603 (the process-wide switch the hot paths read)
        _active = False
        self.provider.shutdown()


def _sample_ratio(settings: TracingSettings) -> float:
    if settings.sample_ratio is not None:
        return settings.sample_ratio
    raw = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "")
    if not raw:
        return 1.0
    try:
        ratio = float(raw)
    except ValueError:
        raise TracingError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a number") from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not in [0, 1]")
    return ratio


def sampler(settings: TracingSettings) -> Sampler:
    """The sampler of :func:`start_tracing`: parent-based (a child follows its parent, a
    message's spans its producer's decision), :func:`linked_or_ratio` at the root."""
    from opentelemetry.sdk.trace.sampling import ParentBased  # noqa: PLC0415

    root = linked_or_ratio(_sample_ratio(settings), batch_ratio=settings.batch_sample_ratio)
    return ParentBased(root)


def start_tracing(settings: TracingSettings) -> Tracing:
    """Configure the OpenTelemetry SDK for this process (the global tracer provider): spans
    batched to an OTLP/gRPC exporter, sampled by :func:`sampler`, the resource named
    ``settings.service_name`` unless ``OTEL_SERVICE_NAME`` says otherwise.
    Call once, early; :meth:`Tracing.shutdown` at the end."""
    global _active  # noqa: PLW0603 (the process-wide switch the hot paths read)
    # Imported here: a process with tracing off never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    named = bool(os.environ.get("OTEL_SERVICE_NAME"))
    attributes = {} if named else {SERVICE_NAME: settings.service_name}
    provider = TracerProvider(
        resource=Resource.create(attributes),
        sampler=sampler(settings),
        span_limits=SpanLimits(max_links=settings.link_limit),
    )
    endpoint = settings.endpoint
    insecure = None if endpoint is None else not endpoint.startswith("https://")
    exporter = OTLPSpanExporter(
        endpoint=endpoint, insecure=insecure, timeout=settings.export_timeout_s
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _active = True
    return Tracing(provider, settings)


def linked_or_ratio(ratio: float, *, batch_ratio: float) -> Sampler:
    """The root sampler (a span without a parent):

    - a span that links a sampled context is kept (an inference request carrying a sampled
      message, the write of a kept request), so a kept message's trace leads to its request;
    - a span over messages or requests (it has :data:`FOLLOWS_LINKS`) linking no sampled
      context is kept with probability ``batch_ratio`` (0: never; its children follow it);
    - any other root (a ``send``, a message without trace context) with probability ``ratio``.

    (An SDK ``Sampler``; made here so a process with tracing off never imports the SDK.)"""
    from opentelemetry.sdk.trace.sampling import (  # noqa: PLC0415
        Decision,
        Sampler,
        SamplingResult,
        TraceIdRatioBased,
    )

    class LinkedOrRatio(Sampler):
        def __init__(self) -> None:
            self._ratio = TraceIdRatioBased(ratio)
            self._batch = TraceIdRatioBased(batch_ratio)

        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> Any:
            if links and any(link.context.trace_flags.sampled for link in links):
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
            fallback = self._batch if attributes and FOLLOWS_LINKS in attributes else self._ratio
            return fallback.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"LinkedOrRatio{{{ratio},batch={batch_ratio}}}"

    return LinkedOrRatio()


def traceparent_of(context: SpanContext) -> str:
    """The W3C ``traceparent`` value of ``context``."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def inject(carrier: MutableMapping[str, str], *, pubsub: bool) -> None:
    """Write the current span's context into a message's attributes (``pubsub``: with
    Google's prefix) or headers. Nothing when no valid span is current."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return
    prefix = PUBSUB_PREFIX if pubsub else ""
    carrier[prefix + TRACEPARENT] = traceparent_of(context)
    state = context.trace_state.to_header()
    if state and len(state) <= _MAX_STATE:  # a longer one is dropped, as W3C allows
        carrier[prefix + TRACESTATE] = state


_MAX_STATE: Final = TRACE_CONTEXT_BYTES - 2 * len(PUBSUB_PREFIX) - 20 - 55 - 10
_HEX: Final = frozenset("0123456789abcdef")


def context_of(attributes: Mapping[str, str]) -> SpanContext | None:
    """The producer's span context a message carries (``googclient_traceparent`` or
    ``traceparent``), or ``None`` when it carries none or a malformed one (a bad value is
    ignored: it never fails the message)."""
    for prefix in (PUBSUB_PREFIX, ""):
        value = attributes.get(prefix + TRACEPARENT)
        if value is not None:
            found = _parse(value, attributes.get(prefix + TRACESTATE, ""))
            if found is not None:
                return found
    return None


def _parse(value: str, state: str) -> SpanContext | None:
    parts = value.strip().split("-")
    if len(parts) < 4 or parts[0] == "ff" or len(parts[0]) != 2:
        return None
    version, trace_id, span_id, flags = parts[:4]
    if version == "00" and len(parts) != 4:
        return None
    if len(trace_id) != 32 or len(span_id) != 16 or len(flags) != 2:
        return None
    if not _HEX.issuperset(version + trace_id + span_id + flags):
        return None
    tid, sid = int(trace_id, 16), int(span_id, 16)
    if tid == 0 or sid == 0:
        return None
    try:
        trace_state = TraceState.from_header([state]) if state else TraceState()
    except ValueError:
        trace_state = TraceState()
    return SpanContext(
        tid, sid, is_remote=True, trace_flags=TraceFlags(int(flags, 16)), trace_state=trace_state
    )
