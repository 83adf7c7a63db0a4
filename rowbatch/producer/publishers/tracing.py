"""The producer's span (docs/tracing.md): one ``send <topic>`` span (PRODUCER) per message,
from the hand-off to the broker's acknowledgement, whose W3C context goes into the message
(Kafka headers ``traceparent``; Pub/Sub attributes ``googclient_traceparent``, as Google's own
client writes them), so the consumer's spans link to it. Made only when tracing is on
(:func:`rowbatch.tracing.active`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from rowbatch.tracing import inject

SYSTEM: Final = {"kafka": "kafka", "pubsub": "gcp_pubsub"}


@contextmanager
def send_span(broker: str, topic: str, attributes: dict[str, str]) -> Iterator[Span]:
    """The span of one publish, current while it runs; its context is written into
    ``attributes`` (the message's)."""
    with trace.get_tracer("rowbatch.producer").start_as_current_span(
        f"send {topic}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": SYSTEM[broker],
            "messaging.operation.type": "send",
            "messaging.destination.name": topic,
        },
    ) as span:
        inject(attributes, pubsub=broker == "pubsub")
        yield span
