"""The consumer's spans (docs/tracing.md), made only when tracing is on: the pipeline's stages
always hold a :class:`PipelineTracer` and call it unconditionally, a :class:`PipelineTracing`
when tracing is on, :data:`NO_TRACING` (whose calls do nothing and allocate nothing) when off:

- ``process <source>`` (CONSUMER), one per message, from intake to its settlement (ack, dead
  letter, nack or withdrawal: ``rowbatch.outcome``), a child of the producer's span the message
  carries, so a message's trace shows where it spent its time;
- ``infer <model>`` (CONSUMER), one per inference request, **linked** to the producer spans of
  the messages whose rows it carries (a message without trace context: to its own ``process``
  span, when that is sampled; each link names the message and its rows in the batch; past
  ``link_limit`` links the rest go on ``infer <model> links`` child spans), with the model,
  the version that answered, the rows and the outcome; the message spans get a link back to it;
- ``dead-letter <source>`` (PRODUCER), a child of the message's span, with the reason;
- ``write <sink>``, one per sink write, linked to the (kept) inference spans whose rows it
  writes.

Sampling (:func:`rowbatch.tracing.linked_or_ratio`): every link is to a sampled context, and
``infer`` and ``write`` carry :data:`rowbatch.tracing.FOLLOWS_LINKS`, so a request is kept
exactly when it carries a sampled message (a write when it writes a kept request), or with
``batch_sample_ratio``; a request that is not kept records nothing under it either.

The model layer adds the gRPC request spans (one per attempt, the endpoint, the context sent
to the server in the request's metadata) and ``backoff`` spans under the inference span.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Final, Protocol

from opentelemetry import trace
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    Span,
    SpanKind,
    Status,
    StatusCode,
    TracerProvider,
)

from rowbatch.tracing import FOLLOWS_LINKS, context_of

__all__ = [
    "NO_TRACING",
    "SYSTEMS",
    "TRACED_MESSAGE_BYTES",
    "NoopPipelineTracing",
    "PipelineTracer",
    "PipelineTracing",
    "TracedBatch",
    "TracedDelivery",
    "TracedPart",
    "TracedSegment",
]

TRACED_MESSAGE_BYTES: Final = 4096
"""What a message's span holds while the message is in flight (the SDK's span with its
attributes, context and links, and the entry that keeps it): measured 3.4 KB with tracemalloc
(tests/unit/consumer/engine/test_memory_accounting.py checks it), plus a link per request that
carries its rows. Charged to each held message's budget when tracing is on."""

SYSTEMS: Final = {"pubsub": "gcp_pubsub", "kafka": "kafka", "table": "rowbatch_table"}
"""``messaging.system`` for each source kind."""


class TracedDelivery(Protocol):
    """What the spans say of a message (a :class:`rowbatch.consumer.sources.delivery.Delivery`)."""

    @property
    def message_id(self) -> str: ...

    @property
    def attributes(self) -> Any: ...

    @property
    def source(self) -> str: ...

    @property
    def delivery_attempt(self) -> int: ...


class TracedSegment(Protocol):
    """A message's rows in a batch (a :class:`rowbatch.consumer.engine.batcher.Segment`)."""

    @property
    def message(self) -> int: ...

    def __len__(self) -> int: ...


class TracedBatch(Protocol):
    """A batch's rows (a :class:`rowbatch.consumer.engine.batcher.Batch`)."""

    @property
    def segments(self) -> Sequence[TracedSegment]: ...

    def __len__(self) -> int: ...


class TracedPart(Protocol):
    """An answered batch waiting to be written (a
    :class:`rowbatch.consumer.engine.results.Answered`) and its inference request's span."""

    @property
    def batch(self) -> TracedBatch: ...

    @property
    def span(self) -> Any: ...


class PipelineTracer(Protocol):
    """What the pipeline's stages call, tracing on (:class:`PipelineTracing`) or off
    (:data:`NO_TRACING`). The span context managers yield a span whose methods
    (``set_attribute``, ``set_status`` ...) may always be called."""

    @property
    def message_bytes(self) -> int:
        """What a message's span holds while the message is in flight, charged to its budget:
        :data:`TRACED_MESSAGE_BYTES`, or 0 when tracing is off."""
        ...

    def opened(self, key: int, delivery: TracedDelivery) -> None: ...

    def closed(self, key: int, outcome: str) -> None: ...

    def closed_many(self, keys: Iterable[int], outcome: str) -> None: ...

    def dead_letter(
        self, key: int | None, delivery: TracedDelivery, reason: str, code: str, text: str
    ) -> AbstractContextManager[Span]: ...

    def inference(
        self, segments: Sequence[TracedSegment], rows: int
    ) -> AbstractContextManager[Span]: ...

    def answered(self, span: Span, version: str, outcome: str) -> None: ...

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[Span]: ...

    def write(
        self, inference_spans: Sequence[Any], rows: int, messages: int
    ) -> AbstractContextManager[Span]: ...

    def write_parts(self, parts: Sequence[TracedPart]) -> AbstractContextManager[Span]: ...


_NO_SPAN: Final[AbstractContextManager[Span]] = nullcontext(INVALID_SPAN)
"""The one context manager every span of :data:`NO_TRACING` is (reusable: it holds nothing);
it yields OpenTelemetry's invalid span, which records nothing."""


class NoopPipelineTracing:
    """Tracing off: every call does nothing, and the span context managers are one shared
    object yielding a span that records nothing (no allocation per call)."""

    __slots__ = ()

    message_bytes: Final = 0

    def opened(self, key: int, delivery: TracedDelivery) -> None:
        pass

    def closed(self, key: int, outcome: str) -> None:
        pass

    def closed_many(self, keys: Iterable[int], outcome: str) -> None:
        pass

    def dead_letter(
        self, key: int | None, delivery: TracedDelivery, reason: str, code: str, text: str
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def inference(
        self, segments: Sequence[TracedSegment], rows: int
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def answered(self, span: Span, version: str, outcome: str) -> None:
        pass

    def span(self, name: str, **attributes: Any) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def write(
        self, inference_spans: Sequence[Any], rows: int, messages: int
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def write_parts(self, parts: Sequence[TracedPart]) -> AbstractContextManager[Span]:
        return _NO_SPAN


NO_TRACING: Final[PipelineTracer] = NoopPipelineTracing()
"""The tracer of a pipeline without tracing (the default)."""


class _Message:
    __slots__ = ("delivery", "producer", "span")

    def __init__(self, delivery: TracedDelivery, producer: Any, span: Span) -> None:
        self.delivery = delivery
        self.producer = producer
        self.span = span


class PipelineTracing:
    """Spans of one pipeline, through the global tracer provider (configured by
    :func:`rowbatch.tracing.start_tracing`) unless ``tracer_provider`` names another."""

    message_bytes: Final = TRACED_MESSAGE_BYTES

    def __init__(
        self,
        *,
        system: str,
        model: str,
        sink: str,
        link_limit: int = 128,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("rowbatch.consumer", tracer_provider=tracer_provider)
        self._system = system
        self._model = model
        self._sink = sink
        self._link_limit = link_limit
        self._messages: dict[int, _Message] = {}

    def _message_span(self, delivery: TracedDelivery, producer: Any) -> Span:
        parent = (
            None
            if producer is None
            else trace.set_span_in_context(trace.NonRecordingSpan(producer))
        )
        attributes: dict[str, str | int] = {
            "messaging.system": self._system,
            "messaging.destination.name": delivery.source,
            "messaging.message.id": delivery.message_id,
        }
        if delivery.delivery_attempt > 1:
            attributes["messaging.gcp_pubsub.message.delivery_attempt"] = delivery.delivery_attempt
        return self._tracer.start_span(
            f"process {delivery.source}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )

    def opened(self, key: int, delivery: TracedDelivery) -> None:
        """Message ``key`` was taken in (its span starts). A message whose producer did not
        sample its trace gets no span at all (parent-based sampling would drop it anyway)."""
        producer = context_of(delivery.attributes)
        if producer is not None and not producer.trace_flags.sampled:
            return
        span = self._message_span(delivery, producer)
        self._messages[key] = _Message(delivery, producer, span)

    def closed(self, key: int, outcome: str) -> None:
        """Message ``key`` was settled: ``acked``, ``dead_lettered``, ``nacked`` or
        ``withdrawn`` (its span ends)."""
        message = self._messages.pop(key, None)
        if message is not None:
            message.span.set_attribute("rowbatch.outcome", outcome)
            message.span.end()

    def closed_many(self, keys: Iterable[int], outcome: str) -> None:
        """``closed`` for each of ``keys``."""
        for key in keys:
            self.closed(key, outcome)

    @contextmanager
    def dead_letter(
        self, key: int | None, delivery: TracedDelivery, reason: str, code: str, text: str
    ) -> Iterator[Span]:
        """The span of one dead-letter publish, under the message's span (one made for the
        occasion when the message never entered the ledger: poison found at intake)."""
        message = self._messages.get(key) if key is not None else None
        own = None
        if message is None:
            own = self._message_span(delivery, context_of(delivery.attributes))
        parent = message.span if message is not None else own
        assert parent is not None
        outcome = "nacked"  # the publish failed: the caller nacks the message
        try:
            with self._tracer.start_as_current_span(
                f"dead-letter {delivery.source}",
                context=trace.set_span_in_context(parent),
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": self._system,
                    "messaging.operation.type": "send",
                    "rowbatch.dlq.reason": reason,
                    "rowbatch.dlq.code": code,
                    "rowbatch.dlq.message": text,
                },
            ) as span:
                span.set_status(Status(StatusCode.ERROR, f"{reason}: {code}"))
                yield span
            outcome = "dead_lettered"
        finally:
            if own is not None:
                own.set_attribute("rowbatch.outcome", outcome)
                own.end()

    @contextmanager
    def inference(self, segments: Sequence[TracedSegment], rows: int) -> Iterator[Span]:
        """The span of one inference request, current while it runs (the gRPC attempts,
        backoffs and isolation are its children), linked to the producers of its messages (a
        message without trace context: to its own span, when sampled). Linking no sampled
        context, it is kept only with the batch ratio (``rowbatch.tracing.linked_or_ratio``)."""
        links: list[Link] = []
        carried: list[_Message] = []
        for segment in segments:
            message = self._messages.get(segment.message)
            if message is None:
                continue
            carried.append(message)
            # Only sampled messages are held with a producer context (``opened``).
            linked = (
                message.producer
                if message.producer is not None
                else message.span.get_span_context()
            )
            if linked.trace_flags.sampled:
                links.append(
                    Link(
                        linked,
                        {
                            "messaging.message.id": message.delivery.message_id,
                            "rowbatch.rows": len(segment),
                        },
                    )
                )
        limit = self._link_limit
        with self._tracer.start_as_current_span(
            f"infer {self._model}",
            kind=SpanKind.CONSUMER,
            links=links[:limit],
            attributes={
                "messaging.system": self._system,
                "messaging.operation.type": "process",
                "messaging.batch.message_count": len(segments),
                "rowbatch.model": self._model,
                "rowbatch.rows": rows,
                FOLLOWS_LINKS: len(links),
            },
        ) as span:
            for at in range(limit, len(links), limit):
                self._tracer.start_span(
                    f"infer {self._model} links",
                    links=links[at : at + limit],
                    attributes={FOLLOWS_LINKS: len(links[at : at + limit])},
                ).end()
            back = Link(span.get_span_context())
            for message in carried:
                message.span.add_link(back.context)
            yield span

    @staticmethod
    def answered(span: Span, version: str, outcome: str) -> None:
        span.set_attribute("rowbatch.model.version", version)
        span.set_attribute("rowbatch.outcome", outcome)

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A child of the current span (isolation)."""
        with self._tracer.start_as_current_span(name, attributes=attributes) as span:
            yield span

    @contextmanager
    def write(self, inference_spans: Sequence[Any], rows: int, messages: int) -> Iterator[Span]:
        """The span of one sink write, linked to the kept inference spans whose rows it writes
        (kept when it links one, else only with the batch ratio)."""
        contexts = (s.get_span_context() for s in inference_spans if s is not None)
        links = [Link(c) for c in contexts if c.trace_flags.sampled]
        with self._tracer.start_as_current_span(
            f"write {self._sink}",
            links=links[: self._link_limit],
            attributes={
                "rowbatch.rows": rows,
                "rowbatch.messages": messages,
                FOLLOWS_LINKS: len(links),
            },
        ) as span:
            yield span

    def write_parts(self, parts: Sequence[TracedPart]) -> AbstractContextManager[Span]:
        """``write`` for the answered ``parts`` of one sink write: linked to their (distinct)
        inference spans, with their rows and messages."""
        spans = list({id(p.span): p.span for p in parts if p.span is not None}.values())
        rows = sum(len(p.batch) for p in parts)
        messages = sum(len(p.batch.segments) for p in parts)
        return self.write(spans, rows, messages)
