"""``NO_TRACING``, the tracer of a pipeline without tracing: every call does nothing, its span
context managers are one shared object (no allocation per call) yielding a span that records
nothing and accepts what the stages call on it, exceptions pass through, and it charges no
bytes to a message's budget."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from opentelemetry.trace import Status, StatusCode

from rowbatch.consumer.observe.tracing import (
    NO_TRACING,
    TRACED_MESSAGE_BYTES,
    NoopPipelineTracing,
    PipelineTracer,
    PipelineTracing,
)


@dataclass(frozen=True)
class _Delivery:
    message_id: str = "m1"
    attributes: object = None
    source: str = "rows/0"
    delivery_attempt: int = 1


def test_no_tracing_does_nothing_and_shares_one_context_manager() -> None:
    t: PipelineTracer = NO_TRACING
    assert isinstance(t, NoopPipelineTracing)
    assert t.message_bytes == 0
    t.opened(1, _Delivery())
    t.closed(1, "acked")
    t.closed_many(iter([1, 2]), "acked")
    managers = {
        id(t.inference([], 0)),
        id(t.span("isolate", x=1)),
        id(t.write([], 0, 0)),
        id(t.write_parts([])),
        id(t.dead_letter(None, _Delivery(), "poison", "c", "text")),
    }
    assert len(managers) == 1
    with t.inference([], 3) as span:
        t.answered(span, "v1", "answered")
        span.set_attribute("rowbatch.rejected_parts", 0)
        span.set_status(Status(StatusCode.ERROR, "x"))
        assert not span.is_recording()


def test_no_tracing_lets_exceptions_through() -> None:
    with pytest.raises(RuntimeError), NO_TRACING.dead_letter(None, _Delivery(), "r", "c", "t"):
        raise RuntimeError("publish failed")


def test_the_real_tracer_charges_its_span() -> None:
    t: PipelineTracer = PipelineTracing(system="kafka", model="m", sink="s")
    assert t.message_bytes == TRACED_MESSAGE_BYTES
