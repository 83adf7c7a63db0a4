"""The publishers' ``send`` spans, against the client stand-ins of ``test_publishers``: the
span's W3C context goes into the message (Kafka header ``traceparent``, Pub/Sub attribute
``googclient_traceparent``), the span names the message id the broker gave; with tracing off
the message is sent as it was."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from google.api_core import exceptions as gexc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import rowbatch.tracing
from rowbatch.producer.publishers.errors import BrokerUnavailable
from rowbatch.producer.publishers.retry import PublishRetry
from rowbatch.tracing import context_of, traceparent_of
from tests.unit import tracing_fixtures
from tests.unit.producer.publish_fakes import FakeKafkaProducer, FakePubSubClient
from tests.unit.producer.test_publishers import TOPIC, _chunk, _g, _kafka, _pubsub
from tests.unit.tracing_fixtures import attrs, context

spans = tracing_fixtures.spans  # the fixture, where pytest finds it


@pytest.fixture
def off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing off, as in a process that never called ``start_tracing``."""
    monkeypatch.setattr(rowbatch.tracing, "_active", False)


# --- Kafka --------------------------------------------------------------------------------------


async def test_kafka_headers_carry_the_send_span(spans: InMemorySpanExporter) -> None:
    pub, factory, _ = _kafka()
    chunk = _chunk("src:1")
    async with pub:
        message_id = await pub.publish(chunk)
    [record] = factory.made[0].records
    [span] = spans.get_finished_spans()
    assert span.name == "send rows"
    assert span.kind is SpanKind.PRODUCER
    assert span.parent is None
    assert attrs(span) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.destination.name": "rows",
        "messaging.message.id": message_id,
    }
    assert message_id == "rows/1/0"
    headers = dict(record.headers)
    assert headers["traceparent"] == traceparent_of(context(span)).encode()
    assert "googclient_traceparent" not in headers
    # The chunk's own headers go too, unchanged, and the chunk itself is left as it was.
    assert record.headers[: len(chunk.kafka_headers)] == chunk.kafka_headers
    assert len(record.headers) == len(chunk.kafka_headers) + 1
    assert "traceparent" not in chunk.attributes


async def test_each_kafka_message_gets_its_own_span(spans: InMemorySpanExporter) -> None:
    pub, factory, _ = _kafka()
    async with pub:
        ids = [await pub.publish(_chunk(f"src:{n}")) for n in range(3)]
    records = factory.made[0].records
    finished = spans.get_finished_spans()
    assert [attrs(s)["messaging.message.id"] for s in finished] == ids
    sent = [dict(r.headers)["traceparent"].decode() for r in records]
    assert sent == [traceparent_of(context(s)) for s in finished]
    assert len(set(sent)) == 3


async def test_kafka_retries_stay_in_one_span(spans: InMemorySpanExporter) -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.send_outcomes = [KafkaConnectionError("gone"), None]

    pub, factory, sleeps = _kafka(prepare)
    async with pub:
        message_id = await pub.publish(_chunk())
    assert len(sleeps.calls) == 1
    [span] = spans.get_finished_spans()
    assert attrs(span)["messaging.message.id"] == message_id
    [record] = factory.made[0].records
    assert dict(record.headers)["traceparent"] == traceparent_of(context(span)).encode()


async def test_a_failed_kafka_publish_ends_its_span_as_an_error(
    spans: InMemorySpanExporter,
) -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.send_outcomes = [KafkaTimeoutError()] * 5

    pub, _, _ = _kafka(prepare, retry=PublishRetry(attempts=2))
    async with pub:
        with pytest.raises(BrokerUnavailable):
            await pub.publish(_chunk())
    [span] = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert "messaging.message.id" not in attrs(span)


@pytest.mark.usefixtures("off")
async def test_kafka_without_tracing_adds_no_header() -> None:
    assert not rowbatch.tracing.active()
    pub, factory, _ = _kafka()
    chunk = _chunk("src:2")
    async with pub:
        await pub.publish(chunk)
    [record] = factory.made[0].records
    assert record.headers == chunk.kafka_headers
    assert context_of({k: v.decode() for k, v in record.headers}) is None


# --- Pub/Sub ------------------------------------------------------------------------------------


async def test_pubsub_attributes_carry_the_send_span(spans: InMemorySpanExporter) -> None:
    client = FakePubSubClient(outcomes=["m-1"])
    pub, _ = _pubsub(client)
    await pub.start()
    chunk = _chunk()
    assert await pub.publish(chunk) == "m-1"
    await pub.close()
    [call] = client.calls
    [span] = spans.get_finished_spans()
    assert span.name == f"send {TOPIC}"
    assert span.kind is SpanKind.PRODUCER
    assert attrs(span) == {
        "messaging.system": "gcp_pubsub",
        "messaging.operation.type": "send",
        "messaging.destination.name": TOPIC,
        "messaging.message.id": "m-1",
    }
    assert call.attrs == {
        **chunk.attributes,
        "googclient_traceparent": traceparent_of(context(span)),
    }
    assert "googclient_traceparent" not in chunk.attributes
    read = context_of(call.attrs)
    assert read is not None
    assert (read.trace_id, read.span_id) == (context(span).trace_id, context(span).span_id)


async def test_pubsub_retries_send_the_same_context(spans: InMemorySpanExporter) -> None:
    client = FakePubSubClient(outcomes=[_g(gexc.ServiceUnavailable, "down"), "m-2"])
    pub, sleeps = _pubsub(client)
    await pub.start()
    assert await pub.publish(_chunk()) == "m-2"
    await pub.close()
    assert len(sleeps.calls) == 1
    [span] = spans.get_finished_spans()
    assert attrs(span)["messaging.message.id"] == "m-2"
    sent = [c.attrs["googclient_traceparent"] for c in client.calls]
    assert sent == [traceparent_of(context(span))] * 2


@pytest.mark.usefixtures("off")
async def test_pubsub_without_tracing_adds_no_attribute() -> None:
    client = FakePubSubClient(outcomes=["m-1"])
    pub, _ = _pubsub(client)
    await pub.start()
    chunk = _chunk()
    await pub.publish(chunk)
    await pub.close()
    [call] = client.calls
    assert call.attrs == chunk.attributes
    assert context_of(call.attrs) is None


async def test_no_spans_when_tracing_is_off(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK is installed, but the process never turned tracing on.
    monkeypatch.setattr(rowbatch.tracing, "_active", False)
    client = FakePubSubClient(outcomes=["m-1"])
    pub, _ = _pubsub(client)
    await pub.start()
    await pub.publish(_chunk())
    await pub.close()
    kafka, factory, _ = _kafka()
    async with kafka:
        await kafka.publish(_chunk())
    assert spans.get_finished_spans() == ()
    assert "googclient_traceparent" not in client.calls[0].attrs
    assert "traceparent" not in dict(factory.made[0].records[0].headers)
