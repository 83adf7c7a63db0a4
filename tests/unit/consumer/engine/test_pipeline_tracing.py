"""The engine's spans, with the fakes of ``test_pipeline``: a ``process`` span per message under
its producer's with the way it was settled, inference spans linked to the producers of the
rows they carry, writes linked to the inference spans, dead letters under their message; and
none at all when the pipeline has no tracing."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

import rowbatch.tracing
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer, PipelineTracing
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.tracing import traceparent_of
from rowbatch.wire.chunks.encode import encode_chunk
from tests.unit import tracing_fixtures
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    RunBatch,
    double,
    make,
    poison_if_negative,
)
from tests.unit.tracing_fixtures import attrs, context, named

spans = tracing_fixtures.spans  # the fixture, where pytest finds it

SUB = "sub"
PROCESS = f"process {SUB}"


def producer(n: int) -> SpanContext:
    """The made-up producer span of message ``n`` (trace ``n``, span ``500 + n``)."""
    return SpanContext(n, 500 + n, True, TraceFlags(TraceFlags.SAMPLED))


def traced(n: int, values: list[float], *, context: bool = True) -> Delivery:
    enc = encode_chunk("t", {"x": np.array(values, np.float64)}, "json", f"chunk-{n}")
    attributes = dict(enc.attributes)
    if context:
        attributes["traceparent"] = traceparent_of(producer(n))
    return Delivery(f"m{n}", enc.payload, attributes, 0.0, 1, SUB)


def undecodable(n: int) -> Delivery:
    attributes = {"content-type": "application/json", "traceparent": traceparent_of(producer(n))}
    return Delivery(f"m{n}", b"{not json", attributes, 0.0, 1, SUB)


def pipeline(
    source: FakeSource,
    sink: FakeSink,
    run: RunBatch,
    tracing: PipelineTracer,
    *,
    target: int = 4,
) -> Pipeline:
    """The engine as ``test_pipeline.make`` builds it, with ``tracing``; batches wait for
    their target size (or the end of the source), so what each one carries is known."""
    return make(source, sink, run, target=target, max_wait_s=3600.0, tracing=tracing)


def link_rows(infers: Sequence[ReadableSpan]) -> Counter[str]:
    """Rows per message id, over the links of ``infers``."""
    rows: Counter[str] = Counter()
    for span in infers:
        for link in span.links:
            link_attrs: Mapping[str, Any] = link.attributes or {}
            rows[str(link_attrs["messaging.message.id"])] += int(link_attrs["rowbatch.rows"])
    return rows


def by_message(finished: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    """The ``process`` spans by message id (each message has exactly one)."""
    processes = named(finished, PROCESS)
    ids = [str(attrs(s)["messaging.message.id"]) for s in processes]
    assert len(ids) == len(set(ids)), f"a message has several spans: {sorted(ids)}"
    return dict(zip(ids, processes, strict=True))


async def test_a_pipeline_run_makes_the_documented_spans(spans: InMemorySpanExporter) -> None:
    good = {1: [1.0], 2: [2.0], 3: [3.0, 4.0], 5: [6.0], 6: [7.0]}
    deliveries = [
        traced(1, good[1]),
        traced(2, good[2]),
        traced(3, good[3]),  # the first batch: three messages, one link over the limit
        traced(4, [5.0, -1.0]),  # rejected by the model: isolated and dead-lettered
        traced(5, good[5]),
        traced(6, good[6]),
        undecodable(7),  # poison at intake: dead-lettered before the ledger
        traced(8, [8.0], context=False),  # no producer context: linked to its own span
    ]
    source, sink = FakeSource(deliveries), FakeSink()
    tracing = PipelineTracing(system="kafka", model="m", sink="fake", link_limit=2)
    run = pipeline(source, sink, poison_if_negative(double), tracing)
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    assert sorted(source.acked) == ["m1", "m2", "m3", "m5", "m6", "m8"]
    assert sorted(mid for mid, _ in source.dead) == ["m4", "m7"]

    finished = spans.get_finished_spans()
    messages = by_message(finished)
    assert sorted(messages) == [f"m{n}" for n in range(1, 9)]
    outcomes = {mid: attrs(s)["rowbatch.outcome"] for mid, s in messages.items()}
    assert outcomes == {
        "m1": "acked",
        "m2": "acked",
        "m3": "acked",
        "m4": "dead_lettered",
        "m5": "acked",
        "m6": "acked",
        "m7": "dead_lettered",
        "m8": "acked",
    }
    for mid, span in messages.items():
        assert span.kind is SpanKind.CONSUMER
        n = int(mid[1:])
        if n == 8:
            assert span.parent is None  # a trace of its own
        else:
            assert span.parent is not None
            assert (span.parent.trace_id, span.parent.span_id) == (n, 500 + n)

    # Inference: links (main spans and their overflow children) carry every row once.
    infers = named(finished, "infer m")
    overflow = named(finished, "infer m links")
    assert infers
    for span in infers:
        assert len(span.links) <= 2
    for child in overflow:
        assert child.parent is not None
        assert child.parent.span_id in {context(s).span_id for s in infers}
    assert any(attrs(s)["rowbatch.links"] > 2 for s in infers)
    assert overflow, "a batch of three traced messages puts its third link on a child"
    rows = link_rows([*infers, *overflow])
    assert {mid: rows[mid] for mid in ("m1", "m2", "m3", "m5", "m6")} == {
        f"m{n}": len(values) for n, values in good.items()
    }
    assert 1 <= rows["m4"] <= 2
    assert "m7" not in rows  # never reached the model
    assert rows["m8"] == 1  # no producer context: linked to its own process span
    answered = {attrs(s)["rowbatch.outcome"] for s in infers}
    assert answered == {"answered", "isolated"}
    assert {attrs(s)["rowbatch.model.version"] for s in infers} == {""}  # FnModel names none

    # Each message that reached the model links back to the inference spans of its rows.
    infer_ids = {context(s).span_id for s in infers}
    for mid in ("m1", "m2", "m3", "m4", "m5", "m6", "m8"):
        back = {link.context.span_id for link in messages[mid].links}
        assert back, mid
        assert back <= infer_ids, mid
    assert not messages["m7"].links

    # Writes link to the inference spans whose rows they write.
    writes = named(finished, "write fake")
    assert writes
    written = {link.context.span_id for w in writes for link in w.links}
    assert written == infer_ids  # every batch had rows that were written
    assert sum(attrs(w)["rowbatch.rows"] for w in writes) == sum(map(len, good.values())) + 1  # m8
    assert all(attrs(w)["rowbatch.rejected_parts"] == 0 for w in writes)

    # Dead letters: under the message span, an error, with the reason.
    dead = {str(attrs(d)["rowbatch.dlq.reason"]): d for d in named(finished, f"dead-letter {SUB}")}
    assert sorted(dead) == ["rejected-by-model", "undecodable"]
    for reason, mid in (("rejected-by-model", "m4"), ("undecodable", "m7")):
        span = dead[reason]
        assert span.kind is SpanKind.PRODUCER
        assert span.status.status_code is StatusCode.ERROR
        assert span.parent is not None
        assert span.parent.span_id == context(messages[mid]).span_id


async def test_the_isolation_is_a_child_of_the_inference_span(
    spans: InMemorySpanExporter,
) -> None:
    source = FakeSource([traced(1, [1.0, -1.0]), traced(2, [2.0, 3.0])])
    tracing = PipelineTracing(system="kafka", model="m", sink="fake")
    run = pipeline(source, FakeSink(), poison_if_negative(double), tracing)
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    finished = spans.get_finished_spans()
    [infer] = named(finished, "infer m")
    [isolate] = named(finished, "isolate")
    assert isolate.parent is not None
    assert isolate.parent.span_id == context(infer).span_id
    assert attrs(isolate)["rowbatch.messages"] == 2
    assert attrs(infer)["rowbatch.outcome"] == "isolated"
    [dead] = named(finished, f"dead-letter {SUB}")
    assert dead.parent is not None
    assert dead.parent.span_id == context(by_message(finished)["m1"]).span_id


@pytest.mark.parametrize("active", [True, False])
async def test_without_tracing_the_pipeline_makes_no_spans(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, active: bool
) -> None:
    monkeypatch.setattr(rowbatch.tracing, "_active", active)
    deliveries = [traced(1, [1.0, 2.0]), traced(2, [3.0, -1.0]), undecodable(3)]
    source, sink = FakeSource(deliveries), FakeSink()
    run = pipeline(source, sink, poison_if_negative(double), NO_TRACING)
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    assert source.acked == ["m1"]
    assert sorted(mid for mid, _ in source.dead) == ["m2", "m3"]
    assert spans.get_finished_spans() == ()


class RefusingDeadLetters(FakeSource):
    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        raise OSError("dead-letter topic unreachable")


async def test_a_failed_dead_letter_of_intake_poison_is_traced_as_nacked(
    spans: InMemorySpanExporter,
) -> None:
    source = RefusingDeadLetters([undecodable(1)])
    run = pipeline(source, FakeSink(), double, PipelineTracing(system="kafka", model="m", sink="f"))
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    assert source.nacked == ["m1"]
    [message] = named(spans.get_finished_spans(), PROCESS)
    assert attrs(message)["rowbatch.outcome"] == "nacked"


async def test_a_failed_dead_letter_of_a_ledger_message_is_traced_as_nacked(
    spans: InMemorySpanExporter,
) -> None:
    source = RefusingDeadLetters([traced(1, [-1.0]), traced(2, [1.0])])
    tracing = PipelineTracing(system="kafka", model="m", sink="f")
    run = pipeline(source, FakeSink(), poison_if_negative(double), tracing)
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    assert source.nacked == ["m1"]
    finished = spans.get_finished_spans()
    outcomes = {mid: attrs(s)["rowbatch.outcome"] for mid, s in by_message(finished).items()}
    assert outcomes == {"m1": "nacked", "m2": "acked"}
    [dead] = named(finished, f"dead-letter {SUB}")
    assert dead.status.status_code is StatusCode.ERROR
    assert [e.name for e in dead.events] == ["exception"]
