"""The consumer's spans (``PipelineTracing``) against the in-memory exporter: a message's
``process`` span under its producer's, inference spans linked to the producers (past the link
limit on child spans) and linked back from the messages, dead letters and sink writes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from rowbatch.consumer.observe.tracing import PipelineTracing, TracedDelivery, TracedSegment
from rowbatch.tracing import traceparent_of
from tests.unit import tracing_fixtures
from tests.unit.tracing_fixtures import attrs, context, named

spans = tracing_fixtures.spans  # the fixture, where pytest finds it

SOURCE = "rows/0"


def producer(n: int, *, sampled: bool = True) -> SpanContext:
    """A made-up producer span's context (trace ``n``, span ``1000 + n``)."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(n, 1000 + n, True, flags)


@dataclass(frozen=True)
class Delivery:
    message_id: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    source: str = SOURCE
    delivery_attempt: int = 1


@dataclass(frozen=True)
class Segment:
    message: int
    rows: int

    def __len__(self) -> int:
        return self.rows


def delivery(
    n: int, *, traced: bool = True, pubsub: bool = False, sampled: bool = True, attempt: int = 1
) -> Delivery:
    name = ("googclient_" if pubsub else "") + "traceparent"
    attributes = {name: traceparent_of(producer(n, sampled=sampled))} if traced else {}
    return Delivery(f"m{n}", {"content-type": "application/json", **attributes}, SOURCE, attempt)


def tracing(link_limit: int = 128) -> PipelineTracing:
    return PipelineTracing(system="kafka", model="scorer", sink="pg", link_limit=link_limit)


def parent_of(span: ReadableSpan) -> SpanContext:
    assert span.parent is not None
    return span.parent


def test_stand_ins_fit_the_protocols() -> None:
    d: TracedDelivery = Delivery("m")
    s: TracedSegment = Segment(0, 3)
    assert (d.message_id, len(s)) == ("m", 3)


# --- process spans ------------------------------------------------------------------------------


@pytest.mark.parametrize("pubsub", [False, True])
def test_a_message_span_is_a_child_of_its_producer(
    spans: InMemorySpanExporter, pubsub: bool
) -> None:
    t = tracing()
    t.opened(7, delivery(3, pubsub=pubsub))
    assert spans.get_finished_spans() == ()  # open until the message is settled
    t.closed(7, "acked")
    [span] = spans.get_finished_spans()
    assert span.name == f"process {SOURCE}"
    assert span.kind is SpanKind.CONSUMER
    assert parent_of(span).trace_id == 3
    assert parent_of(span).span_id == 1003
    assert parent_of(span).is_remote
    assert context(span).trace_id == 3
    assert attrs(span)["messaging.system"] == "kafka"
    assert attrs(span)["messaging.destination.name"] == SOURCE
    assert attrs(span)["messaging.message.id"] == "m3"
    assert attrs(span)["rowbatch.outcome"] == "acked"
    assert "messaging.gcp_pubsub.message.delivery_attempt" not in attrs(span)  # a first delivery


def test_a_redelivery_names_its_attempt(spans: InMemorySpanExporter) -> None:
    t = tracing()
    t.opened(1, delivery(1, attempt=3))
    t.closed(1, "acked")
    [span] = spans.get_finished_spans()
    assert attrs(span)["messaging.gcp_pubsub.message.delivery_attempt"] == 3


def test_a_message_its_producer_did_not_sample_gets_no_span(
    spans: InMemorySpanExporter,
) -> None:
    t = tracing()
    t.opened(1, delivery(1, sampled=False))
    t.opened(2, delivery(2))
    with t.inference([Segment(1, 2), Segment(2, 1)], 3):
        pass
    t.closed(1, "acked")
    t.closed(2, "acked")
    infer, message = spans.get_finished_spans()
    assert [link.context.trace_id for link in infer.links] == [2]
    assert attrs(message)["messaging.message.id"] == "m2"
    assert [link.context for link in message.links] == [context(infer)]


def test_a_message_without_context_starts_a_trace(spans: InMemorySpanExporter) -> None:
    t = tracing()
    t.opened(1, delivery(1, traced=False))
    t.opened(2, Delivery("m2", {"traceparent": "00-junk"}))
    t.closed(1, "nacked")
    t.closed(2, "withdrawn")
    first, second = spans.get_finished_spans()
    assert first.parent is None
    assert second.parent is None
    assert context(first).trace_id != context(second).trace_id
    assert [attrs(s)["rowbatch.outcome"] for s in (first, second)] == ["nacked", "withdrawn"]


def test_a_message_is_closed_once(spans: InMemorySpanExporter) -> None:
    t = tracing()
    t.opened(1, delivery(1))
    t.closed(1, "acked")
    t.closed(1, "nacked")  # already settled: nothing
    t.closed(99, "acked")  # never opened: nothing
    [span] = spans.get_finished_spans()
    assert attrs(span)["rowbatch.outcome"] == "acked"


# --- inference spans ----------------------------------------------------------------------------


def test_inference_links_the_producers_of_its_messages(spans: InMemorySpanExporter) -> None:
    t = tracing()
    t.opened(10, delivery(1))
    t.opened(11, delivery(2, traced=False))
    t.opened(12, delivery(3, pubsub=True))
    segments = [Segment(10, 4), Segment(11, 2), Segment(12, 1)]
    with t.inference(segments, 7) as span:
        assert trace.get_current_span() is span
        t.answered(span, "2", "answered")
    [infer] = spans.get_finished_spans()
    assert infer.name == "infer scorer"
    assert infer.kind is SpanKind.CONSUMER
    assert infer.parent is None
    assert attrs(infer) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.batch.message_count": 3,
        "rowbatch.model": "scorer",
        "rowbatch.rows": 7,
        "rowbatch.links": 3,
        "rowbatch.model.version": "2",
        "rowbatch.outcome": "answered",
    }
    # Each message's span links back to the inference span, the untraced one too.
    for key in (10, 11, 12):
        t.closed(key, "acked")
    messages = named(spans.get_finished_spans(), f"process {SOURCE}")
    assert len(messages) == 3
    for message in messages:
        assert [link.context for link in message.links] == [context(infer)]
    # The producers' spans; the message without a producer context: its own (sampled) span.
    [untraced] = [m for m in messages if attrs(m)["messaging.message.id"] == "m2"]
    assert [link.context for link in infer.links] == [
        producer(1),
        context(untraced),
        producer(3),
    ]
    assert [dict(link.attributes or {}) for link in infer.links] == [
        {"messaging.message.id": "m1", "rowbatch.rows": 4},
        {"messaging.message.id": "m2", "rowbatch.rows": 2},
        {"messaging.message.id": "m3", "rowbatch.rows": 1},
    ]


def test_inference_skips_messages_already_settled(spans: InMemorySpanExporter) -> None:
    t = tracing()
    t.opened(1, delivery(1))
    t.opened(2, delivery(2))
    t.closed(2, "nacked")
    with t.inference([Segment(1, 2), Segment(2, 2)], 4):
        pass
    infer = named(spans.get_finished_spans(), "infer scorer")[0]
    assert [link.context.trace_id for link in infer.links] == [1]
    assert attrs(infer)["messaging.batch.message_count"] == 2


def test_links_past_the_limit_go_on_child_spans(spans: InMemorySpanExporter) -> None:
    t = tracing(link_limit=2)
    for n in range(5):
        t.opened(n, delivery(n + 1))
    segments = [Segment(n, n + 1) for n in range(5)]
    with t.inference(segments, 15):
        pass
    finished = spans.get_finished_spans()
    [infer] = named(finished, "infer scorer")
    children = named(finished, "infer scorer links")
    assert [link.context.trace_id for link in infer.links] == [1, 2]
    assert attrs(infer)["rowbatch.links"] == 5
    assert [[link.context.trace_id for link in c.links] for c in children] == [[3, 4], [5]]
    assert [attrs(c)["rowbatch.links"] for c in children] == [2, 1]
    for child in children:
        assert parent_of(child).span_id == context(infer).span_id
        assert context(child).trace_id == context(infer).trace_id
    rows = {
        dict(link.attributes or {})["messaging.message.id"]: dict(link.attributes or {})[
            "rowbatch.rows"
        ]
        for s in (infer, *children)
        for link in s.links
    }
    assert rows == {f"m{n + 1}": n + 1 for n in range(5)}


def test_links_at_the_limit_need_no_child(spans: InMemorySpanExporter) -> None:
    t = tracing(link_limit=2)
    for n in range(2):
        t.opened(n, delivery(n + 1))
    with t.inference([Segment(0, 1), Segment(1, 1)], 2):
        pass
    assert [s.name for s in spans.get_finished_spans()] == ["infer scorer"]


def test_spans_under_inference_are_its_children(spans: InMemorySpanExporter) -> None:
    t = tracing()
    with t.inference([], 0), t.span("isolate", **{"rowbatch.messages": 2}):
        pass
    isolate, infer = spans.get_finished_spans()
    assert isolate.name == "isolate"
    assert attrs(isolate) == {"rowbatch.messages": 2}
    assert parent_of(isolate).span_id == context(infer).span_id


# --- dead letters -------------------------------------------------------------------------------


def test_a_dead_letter_is_a_child_of_the_message_span(spans: InMemorySpanExporter) -> None:
    t = tracing()
    d = delivery(4)
    t.opened(1, d)
    with t.dead_letter(1, d, "rejected-by-model", "INVALID_ARGUMENT", "bad row") as span:
        assert trace.get_current_span() is span
    [dead] = spans.get_finished_spans()  # the message's span is still open
    t.closed(1, "dead_lettered")
    dead, message = spans.get_finished_spans()
    assert dead.name == f"dead-letter {SOURCE}"
    assert dead.kind is SpanKind.PRODUCER
    assert parent_of(dead).span_id == context(message).span_id
    assert context(dead).trace_id == 4
    assert attrs(dead) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "rowbatch.dlq.reason": "rejected-by-model",
        "rowbatch.dlq.code": "INVALID_ARGUMENT",
        "rowbatch.dlq.message": "bad row",
    }
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.status.description == "rejected-by-model: INVALID_ARGUMENT"
    assert attrs(message)["rowbatch.outcome"] == "dead_lettered"


def test_a_dead_letter_outside_the_ledger_makes_its_own_message_span(
    spans: InMemorySpanExporter,
) -> None:
    t = tracing()
    d = delivery(6)
    with t.dead_letter(None, d, "undecodable", "BAD_JSON", "not json"):
        pass
    dead, message = spans.get_finished_spans()
    assert dead.name == f"dead-letter {SOURCE}"
    assert message.name == f"process {SOURCE}"
    assert message.kind is SpanKind.CONSUMER
    assert attrs(message)["rowbatch.outcome"] == "dead_lettered"
    assert attrs(message)["messaging.message.id"] == "m6"
    assert parent_of(message).span_id == 1006
    assert parent_of(dead).span_id == context(message).span_id


def test_a_dead_letter_of_a_settled_key_makes_its_own_message_span(
    spans: InMemorySpanExporter,
) -> None:
    t = tracing()
    with t.dead_letter(42, delivery(2), "undecodable", "X", "y"):
        pass
    dead, message = spans.get_finished_spans()
    assert parent_of(dead).span_id == context(message).span_id
    assert attrs(message)["rowbatch.outcome"] == "dead_lettered"


def test_a_failing_dead_letter_still_ends_its_spans(spans: InMemorySpanExporter) -> None:
    t = tracing()
    with (
        pytest.raises(OSError, match="broker down"),
        t.dead_letter(None, delivery(1), "undecodable", "X", "y"),
    ):
        raise OSError("broker down")
    dead, message = spans.get_finished_spans()
    assert dead.status.status_code is StatusCode.ERROR
    assert [e.name for e in dead.events] == ["exception"]
    assert message.end_time is not None


# --- writes -------------------------------------------------------------------------------------


def test_a_write_links_to_its_inference_spans(spans: InMemorySpanExporter) -> None:
    t = tracing()
    with t.inference([], 0) as first:
        pass
    with t.inference([], 0) as second:
        pass
    with t.write([first, None, second], rows=9, messages=4) as span:
        assert trace.get_current_span() is span
    a, b, write = spans.get_finished_spans()
    assert write.name == "write pg"
    assert [link.context for link in write.links] == [context(a), context(b)]
    assert attrs(write) == {"rowbatch.rows": 9, "rowbatch.messages": 4, "rowbatch.links": 2}


def test_a_write_links_only_kept_inference_spans(spans: InMemorySpanExporter) -> None:
    t = tracing()
    with t.inference([], 0) as kept:
        pass
    dropped = trace.NonRecordingSpan(SpanContext(5, 6, False, TraceFlags(TraceFlags.DEFAULT)))
    with t.write([dropped, kept], rows=2, messages=2):
        pass
    infer, write = spans.get_finished_spans()
    assert [link.context for link in write.links] == [context(infer)]
    assert attrs(write)["rowbatch.links"] == 1


def test_a_write_keeps_at_most_the_link_limit(spans: InMemorySpanExporter) -> None:
    t = tracing(link_limit=2)
    inferences = []
    for _ in range(3):
        with t.inference([], 0) as span:
            inferences.append(span)
    with t.write(inferences, rows=3, messages=3):
        pass
    write = named(spans.get_finished_spans(), "write pg")[0]
    assert [link.context for link in write.links] == [s.get_span_context() for s in inferences[:2]]


def test_a_dead_letter_of_an_unsampled_message_records_nothing(
    spans: InMemorySpanExporter,
) -> None:
    t = tracing()
    unsampled = delivery(3, sampled=False)
    t.opened(1, unsampled)
    with t.dead_letter(1, unsampled, "rejected-by-model", "X", "y") as span:
        assert not span.is_recording()
    with t.dead_letter(None, unsampled, "undecodable", "X", "y"):
        pass
    t.closed(1, "dead_lettered")
    assert spans.get_finished_spans() == ()
