"""Which spans the consumer exports under the sampler it really runs with
(``rowbatch.tracing.sampler``), through the engine with the fakes of ``test_pipeline``: an
inference request, its children and the sink writes are exported only when the batch carries
a sampled message, unless ``batch_sample_ratio`` says otherwise; messages without trace
context follow the consumer's own ``sample_ratio``, and so do the requests that carry them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

from rowbatch.consumer.observe.tracing import PipelineTracing
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.tracing import TracingSettings, sampler, traceparent_of
from rowbatch.wire.chunks.encode import encode_chunk
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    double,
    make,
    poison_if_negative,
)
from tests.unit.tracing_fixtures import attrs, context, named

SUB = "sub"
PER_BATCH = 3
"""One-row messages a batch carries (the batcher's target, reached before any timeout)."""


def delivery(n: int, *, sampled: bool | None, value: float = 1.0) -> Delivery:
    """Message ``n`` with one row; ``sampled`` is its producer's flag, ``None`` for a producer
    that does not trace (no context at all)."""
    enc = encode_chunk("t", {"x": np.array([value], np.float64)}, "json", f"chunk-{n}")
    attributes = dict(enc.attributes)
    if sampled is not None:
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        attributes["traceparent"] = traceparent_of(SpanContext(n + 1, 500 + n, True, flags))
    return Delivery(f"m{n}", enc.payload, attributes, 0.0, 1, SUB)


async def run_traced(
    deliveries: Sequence[Delivery], settings: TracingSettings
) -> list[ReadableSpan]:
    """The pipeline over ``deliveries`` with a tracer provider sampling as ``start_tracing``
    would with ``settings``; the spans it exported."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler(settings))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing = PipelineTracing(
        system="kafka", model="m", sink="fake", link_limit=1, tracer_provider=provider
    )
    source = FakeSource(deliveries)
    run = make(
        source,
        FakeSink(),
        poison_if_negative(double),
        target=PER_BATCH,
        max_wait_s=3600.0,
        tracing=tracing,
    )
    await asyncio.wait_for(run.run(asyncio.Event()), 10)
    assert len(source.acked) + len(source.dead) == len(deliveries)
    return list(memory.get_finished_spans())


def batches(sampled: AbstractSet[int], *, poison: AbstractSet[int] = frozenset()) -> list[Delivery]:
    """Five batches of ``PER_BATCH`` messages, traced by their producer, sampled where
    ``sampled`` names them; the messages in ``poison`` carry a row the model rejects."""
    return [
        delivery(n, sampled=n in sampled, value=-1.0 if n in poison else 1.0)
        for n in range(5 * PER_BATCH)
    ]


def linked_messages(finished: Sequence[ReadableSpan]) -> set[str]:
    """The message ids named by the links of the ``infer`` spans and their ``links`` children."""
    return {
        str(dict(link.attributes or {})["messaging.message.id"])
        for span in [*named(finished, "infer m"), *named(finished, "infer m links")]
        for link in span.links
    }


async def test_only_batches_carrying_a_sampled_message_are_exported() -> None:
    # Batch 1 (m3-m5) carries two sampled messages and a poison row (so an isolation under
    # it, and a link on a child span), batch 3 (m9-m11) one; batch 4 (m12-m14) is isolated
    # too, but carries no sampled message.
    deliveries = batches({3, 4, 10}, poison={5, 13})
    finished = await run_traced(deliveries, TracingSettings("svc"))

    infers = named(finished, "infer m")
    assert len(infers) == 2, [attrs(s) for s in infers]
    assert linked_messages(finished) == {"m3", "m4", "m10"}
    kept = {context(s).span_id for s in infers}
    # The requests' children: the isolation of batch 1 only, and the link past the limit of
    # batch 1 (link_limit 1).
    isolates = named(finished, "isolate")
    assert len(isolates) == 1
    assert isolates[0].parent is not None
    assert isolates[0].parent.span_id in kept
    children = named(finished, "infer m links")
    assert [len(c.links) for c in children] == [1]
    assert all(c.parent is not None and c.parent.span_id in kept for c in children)
    bisections = [s for s in infers if s.parent is not None]
    assert not bisections  # requests are roots: nothing else of batch 4's isolation
    # Writes: exported only where they wrote a kept request's rows, linked to it alone.
    writes = named(finished, "write fake")
    assert writes
    for write in writes:
        assert write.links
        assert {link.context.span_id for link in write.links} <= kept
        assert attrs(write)["rowbatch.links"] == len(write.links)
    # Messages: the three sampled ones, nothing of the other twelve (nor their dead letters).
    processes = named(finished, f"process {SUB}")
    assert sorted(str(attrs(p)["messaging.message.id"]) for p in processes) == ["m10", "m3", "m4"]
    assert named(finished, f"dead-letter {SUB}") == []  # m5 and m13 were not sampled
    names = {s.name for s in finished}
    assert names <= {
        "infer m",
        "infer m links",
        "isolate",
        "write fake",
        f"process {SUB}",
        f"dead-letter {SUB}",
    }


async def test_no_sampled_message_no_request_span() -> None:
    finished = await run_traced(batches(set()), TracingSettings("svc", sample_ratio=1.0))
    assert finished == []


async def test_a_batch_ratio_keeps_requests_that_carry_no_sampled_message() -> None:
    finished = await run_traced(
        batches({4}), TracingSettings("svc", sample_ratio=0.0, batch_sample_ratio=1.0)
    )
    infers = named(finished, "infer m")
    assert len(infers) == 5
    assert sum(len(s.links) for s in infers) == 1  # only the sampled message is linked
    assert len(named(finished, f"process {SUB}")) == 1
    assert named(finished, "write fake")


@pytest.mark.parametrize("ratio", [1.0, 0.0])
async def test_without_producer_context_the_consumer_ratio_decides(ratio: float) -> None:
    """Producers that do not trace: each message starts a trace kept with ``sample_ratio``,
    and a request carrying a kept message is kept (linked to the message's own span)."""
    deliveries = [delivery(n, sampled=None) for n in range(5 * PER_BATCH)]
    finished = await run_traced(deliveries, TracingSettings("svc", sample_ratio=ratio))
    if ratio == 0.0:
        assert finished == []
        return
    processes = named(finished, f"process {SUB}")
    assert len(processes) == 5 * PER_BATCH
    assert all(p.parent is None for p in processes)
    infers = named(finished, "infer m")
    assert len(infers) == 5
    assert linked_messages(finished) == {f"m{n}" for n in range(5 * PER_BATCH)}
    own = {context(p).span_id for p in processes}
    for infer in infers:
        assert {link.context.span_id for link in infer.links} <= own
    assert named(finished, "write fake")
