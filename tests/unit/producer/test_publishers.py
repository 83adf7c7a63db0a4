"""The publishers against stand-ins of their clients: what they send, retries of transient
errors (tenacity, no real sleeping), permanent errors surfaced with the topic named, the
start-up checks, splitting, and the in-flight window."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
from aiokafka import codec
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
)
from google.api_core import exceptions as gexc
from google.cloud.pubsub_v1.publisher.exceptions import PublishToPausedOrderingKeyException

from rowbatch.producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    PublishFailed,
    TopicNotFound,
)
from rowbatch.producer.publishers.kafka import KafkaPublisher, KafkaPublisherSettings
from rowbatch.producer.publishers.messages import RawMessage
from rowbatch.producer.publishers.pubsub import (
    PubSubFlowControl,
    PubSubPublisher,
    PubSubPublisherSettings,
    pubsub_topic_path,
)
from rowbatch.producer.publishers.retry import PublishRetry
from rowbatch.producer.publishers.splitting import publish_rows
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.wire.chunks.encode import EncodedChunk, EncodeOptions, encode_chunk
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ORDERING_KEY
from tests.unit.producer.publish_fakes import (
    FakeKafkaProducer,
    FakePublisher,
    FakePubSubClient,
    kafka_factory,
    reassemble,
)

TOPIC = "projects/proj/topics/rows"


def _g(cls: Any, message: str) -> Exception:
    """A google.api_core exception (its constructors are untyped)."""
    error: Exception = cls(message)
    return error


class Sleeps:
    """An injected sleep that records and does not wait."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        await asyncio.sleep(0)


def _chunk(chunk_id: str = "src:1", rows: int = 3, ordering_key: str | None = None) -> EncodedChunk:
    return encode_chunk(
        "orders",
        {"id": list(range(rows)), "text": ["a"] * rows},
        "json",
        chunk_id,
        options=EncodeOptions(ordering_key=ordering_key),
    )


def _pubsub(
    client: FakePubSubClient, *, emulator_host: str | None = None, **settings: Any
) -> tuple[PubSubPublisher, Sleeps]:
    """A publisher on ``client``; ``settings``: :class:`PubSubPublisherSettings` fields."""
    sleeps = Sleeps()
    settings.setdefault("retry", PublishRetry(attempts=4, max_seconds=60))
    pub = PubSubPublisher(
        TOPIC,
        client=client,
        emulator_host=emulator_host,
        settings=PubSubPublisherSettings(**settings),
        sleep=sleeps,
    )
    return pub, sleeps


# --- Pub/Sub ----------------------------------------------------------------------------------


def test_topic_paths() -> None:
    assert pubsub_topic_path("rows", "proj") == TOPIC
    assert pubsub_topic_path(TOPIC) == TOPIC
    with pytest.raises(ValueError, match="no project"):
        pubsub_topic_path("rows", None)
    with pytest.raises(ValueError, match="projects/P/topics/T"):
        pubsub_topic_path("a/b", "proj")


async def test_pubsub_publish_sends_payload_and_attributes() -> None:
    client = FakePubSubClient(outcomes=["m-1"])
    pub, _ = _pubsub(client)
    await pub.start()
    chunk = _chunk()
    assert await pub.publish(chunk) == "m-1"
    await pub.close()
    (call,) = client.calls
    assert call.topic == TOPIC
    assert call.data == chunk.payload
    assert call.attrs == chunk.attributes
    assert call.ordering_key == ""
    assert call.retry is None  # retries are ours, bounded by the policy
    assert not client.stopped  # an injected client belongs to the caller


async def test_pubsub_retries_transient_errors_then_succeeds() -> None:
    client = FakePubSubClient(
        outcomes=[_g(gexc.ServiceUnavailable, "down"), _g(gexc.DeadlineExceeded, "slow"), "m-3"]
    )
    pub, sleeps = _pubsub(client)
    await pub.start()
    assert await pub.publish(_chunk()) == "m-3"
    assert len(client.calls) == 3
    assert len(sleeps.calls) == 2
    # The same message each time: same payload, same chunk id (the idempotency key).
    assert len({(c.data, c.attrs[H_CHUNK_ID]) for c in client.calls}) == 1
    await pub.close()


async def test_pubsub_resumes_an_ordering_key_after_a_failure() -> None:
    client = FakePubSubClient(outcomes=[_g(gexc.ServiceUnavailable, "down"), "m-2"])
    pub, _ = _pubsub(client)
    await pub.start()
    chunk = _chunk(ordering_key="customer-7")
    assert await pub.publish(chunk) == "m-2"
    assert [c.ordering_key for c in client.calls] == ["customer-7", "customer-7"]
    assert client.resumed == [(TOPIC, "customer-7")]
    await pub.close()


async def test_pubsub_retries_a_message_refused_for_a_paused_ordering_key() -> None:
    paused = PublishToPausedOrderingKeyException("customer-7")
    client = FakePubSubClient(outcomes=[paused, "m-2"])
    pub, _ = _pubsub(client)
    await pub.start()
    assert await pub.publish(_chunk(ordering_key="customer-7")) == "m-2"
    assert client.resumed == [(TOPIC, "customer-7")]
    await pub.close()


async def test_pubsub_gives_up_after_the_attempts_naming_topic_and_chunk() -> None:
    client = FakePubSubClient(outcomes=[_g(gexc.ServiceUnavailable, "down")] * 10)
    pub, sleeps = _pubsub(client, retry=PublishRetry(attempts=3))
    await pub.start()
    with pytest.raises(BrokerUnavailable) as info:
        await pub.publish(_chunk("src:9"))
    assert len(client.calls) == 3
    assert len(sleeps.calls) == 2
    message = str(info.value)
    assert TOPIC in message and "'src:9'" in message and "3 attempt" in message
    await pub.close()


async def test_pubsub_permanent_errors_are_not_retried() -> None:
    client = FakePubSubClient(outcomes=[_g(gexc.InvalidArgument, "bad attribute")])
    pub, sleeps = _pubsub(client)
    await pub.start()
    with pytest.raises(PublishFailed, match=r"projects/proj/topics/rows.*refused chunk 'src:1'"):
        await pub.publish(_chunk())
    assert len(client.calls) == 1
    assert sleeps.calls == []
    await pub.close()


async def test_pubsub_topic_deleted_while_publishing_is_topic_not_found() -> None:
    client = FakePubSubClient(outcomes=[_g(gexc.NotFound, "Resource not found (resource=rows).")])
    pub, _ = _pubsub(client)
    await pub.start()
    with pytest.raises(TopicNotFound, match=r"rows.*does not exist"):
        await pub.publish(_chunk())
    await pub.close()


async def test_pubsub_refuses_an_oversized_message_before_sending() -> None:
    client = FakePubSubClient()
    pub, _ = _pubsub(client, max_message_bytes=200)
    await pub.start()
    with pytest.raises(MessageTooLarge, match=r"chunk 'big:1' is \d+ bytes.*200-byte limit"):
        await pub.publish(_chunk("big:1", rows=100))
    assert client.calls == []
    await pub.close()


async def test_pubsub_start_checks_the_topic() -> None:
    client = FakePubSubClient(get_topic_errors=[_g(gexc.NotFound, "no topic")])
    pub, _ = _pubsub(client)
    with pytest.raises(TopicNotFound) as info:
        await pub.start()
    assert f"Pub/Sub topic {TOPIC!r} does not exist" in str(info.value)
    assert "gcloud pubsub topics create rows --project proj" in str(info.value)
    assert info.value.topic == TOPIC
    await pub.close()


async def test_pubsub_start_tolerates_a_publish_only_identity() -> None:
    client = FakePubSubClient(get_topic_errors=[_g(gexc.PermissionDenied, "topics.get")])
    pub, _ = _pubsub(client)
    await pub.start()  # roles/pubsub.publisher cannot get the topic; publishing still works
    assert await pub.publish(_chunk()) == "id-1"
    await pub.close()


async def test_pubsub_start_retries_then_reports_the_unreachable_address() -> None:
    client = FakePubSubClient(get_topic_forever=_g(gexc.ServiceUnavailable, "connection refused"))
    pub, _ = _pubsub(client, connect_timeout_s=0.3, emulator_host="127.0.0.1:1")
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as info:
        await pub.start()
    assert time.monotonic() - started < 5
    assert client.get_topic_calls > 1
    assert "cannot reach Pub/Sub at 127.0.0.1:1" in str(info.value)
    assert TOPIC in str(info.value)
    await pub.close()


async def test_pubsub_publish_under_flow_control_does_not_block_the_loop() -> None:
    gate = threading.Event()
    client = FakePubSubClient(block=gate)
    pub, _ = _pubsub(client)
    await pub.start()
    task = asyncio.create_task(pub.publish(_chunk()))
    # The publish call is stuck in its worker thread; the loop still runs other work.
    ticks = 0
    for _ in range(5):
        await asyncio.sleep(0.01)
        ticks += 1
    assert not task.done() and ticks == 5
    gate.set()
    assert await task == "id-1"
    await pub.close()


def test_pubsub_flow_control_must_hold_one_message() -> None:
    with pytest.raises(ValueError, match="would block forever"):
        PubSubPublisher(
            TOPIC,
            client=FakePubSubClient(),
            settings=PubSubPublisherSettings(flow_control=PubSubFlowControl(10, 1000)),
        )


def test_pubsub_max_chunk_bytes_leaves_room_for_the_request() -> None:
    pub = PubSubPublisher(TOPIC, client=FakePubSubClient())
    assert 9_990_000 < pub.max_chunk_bytes < 10_000_000
    small, _ = _pubsub(FakePubSubClient(), max_message_bytes=50_000)
    assert small.max_chunk_bytes == 50_000
    with pytest.raises(ValueError, match="Pub/Sub's limit"):
        _pubsub(FakePubSubClient(), max_message_bytes=20_000_000)


async def test_pubsub_publish_before_start_is_an_error() -> None:
    pub, _ = _pubsub(FakePubSubClient())
    pub._client = None  # as if made without a client and never started
    with pytest.raises(RuntimeError, match="before start"):
        await pub.publish(_chunk())
    await pub.close()


# --- Kafka ------------------------------------------------------------------------------------


def _kafka(
    prepare: Any = None, client_options: dict[str, Any] | None = None, **settings: Any
) -> tuple[KafkaPublisher, Any, Sleeps]:
    """A publisher on a fake producer; ``settings``: :class:`KafkaPublisherSettings` fields;
    ``client_options``: passed through to the producer."""
    sleeps = Sleeps()
    factory = kafka_factory(prepare)
    settings.setdefault("retry", PublishRetry(attempts=4))
    pub = KafkaPublisher(
        "k1:9092,k2:9092",
        "rows",
        settings=KafkaPublisherSettings(**settings),
        producer_factory=factory,
        sleep=sleeps,
        **(client_options or {}),
    )
    return pub, factory, sleeps


async def test_kafka_producer_is_idempotent_with_acks_all() -> None:
    pub, factory, _ = _kafka(
        compression="gzip",
        max_message_bytes=2_000_000,
        client_options={"security_protocol": "SSL"},
    )
    async with pub:
        pass
    (producer,) = factory.made
    config = producer.config
    assert config["acks"] == "all"
    assert config["enable_idempotence"] is True
    assert config["compression_type"] == "gzip"
    assert config["max_request_size"] == 2_000_000
    assert config["max_batch_size"] <= 2_000_000
    assert config["security_protocol"] == "SSL"  # passed through
    assert config["bootstrap_servers"] == "k1:9092,k2:9092"
    assert producer.started and producer.stopped


async def test_kafka_record_has_chunk_headers_and_the_chunk_id_as_key() -> None:
    pub, factory, _ = _kafka()
    async with pub:
        chunk = _chunk("src:5")
        assert await pub.publish(chunk) == "rows/1/0"
        keyed = _chunk("src:6", ordering_key="cust-1")
        await pub.publish(keyed)
        await pub.publish(_chunk("src:7"), key="explicit")
    first, second, third = factory.made[0].records
    assert first.value == chunk.payload
    assert first.headers == chunk.kafka_headers
    assert all(name == name.lower() for name, _ in first.headers)
    assert first.key == b"src:5"
    assert second.key == b"cust-1"
    assert dict(second.headers)[H_ORDERING_KEY] == b"cust-1"
    assert third.key == b"explicit"


async def test_kafka_retries_retriable_errors() -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.send_outcomes = [KafkaConnectionError("gone"), KafkaTimeoutError(), None]

    pub, factory, sleeps = _kafka(prepare)
    async with pub:
        assert await pub.publish(_chunk()) == "rows/1/0"
    producer = factory.made[0]
    assert producer.attempts == 3
    assert len(sleeps.calls) == 2
    assert len(producer.records) == 1


async def test_kafka_gives_up_naming_the_topic() -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.send_outcomes = [KafkaTimeoutError()] * 10

    pub, factory, _ = _kafka(prepare, retry=PublishRetry(attempts=2))
    async with pub:
        with pytest.raises(BrokerUnavailable, match=r"Kafka topic 'rows' at k1:9092,k2:9092"):
            await pub.publish(_chunk("src:3"))
    assert factory.made[0].attempts == 2


async def test_kafka_permanent_errors_surface_at_once() -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.send_outcomes = [MessageSizeTooLargeError(), TopicAuthorizationFailedError()]

    pub, factory, sleeps = _kafka(prepare)
    async with pub:
        with pytest.raises(MessageTooLarge, match=r"'rows'.*max.message.bytes"):
            await pub.publish(_chunk("src:1"))
        with pytest.raises(PublishFailed, match=r"'rows'.*refused chunk 'src:2'.*Authorization"):
            await pub.publish(_chunk("src:2"))
    assert factory.made[0].attempts == 2
    assert sleeps.calls == []


async def test_kafka_refuses_an_oversized_message_before_sending() -> None:
    pub, factory, _ = _kafka(max_message_bytes=5000)
    async with pub:
        assert pub.max_chunk_bytes < 5000
        with pytest.raises(MessageTooLarge, match="'rows'"):
            await pub.publish(RawMessage(b"x" * 4900, {H_CHUNK_ID: "raw:1"}))
    assert factory.made[0].attempts == 0


async def test_kafka_start_reports_a_missing_topic_and_stops_the_producer() -> None:
    def prepare(p: FakeKafkaProducer) -> None:
        p.topics = {"orders": 1, "__consumer_offsets": 6}

    pub, factory, _ = _kafka(prepare)
    with pytest.raises(TopicNotFound) as info:
        async with pub:
            pass
    assert "Kafka topic 'rows' does not exist on k1:9092,k2:9092" in str(info.value)
    assert "topics there: orders)" in str(info.value)
    assert factory.made[0].stopped


async def test_kafka_start_reports_an_unreachable_broker() -> None:
    def refuse(p: FakeKafkaProducer) -> None:
        p.start_error = KafkaConnectionError("Unable to bootstrap from [('k1', 9092)]")

    pub, factory, _ = _kafka(refuse)
    with pytest.raises(BrokerUnavailable, match=r"cannot reach Kafka at k1:9092,k2:9092"):
        await pub.start()
    await pub.close()
    assert factory.made[0].stopped

    def hang(p: FakeKafkaProducer) -> None:
        p.start_hangs = True

    pub, _, _ = _kafka(hang, connect_timeout_s=0.1)
    with pytest.raises(BrokerUnavailable, match=r"no answer within 0.1 s"):
        await pub.start()
    await pub.close()


def test_kafka_compression_without_its_library_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "has_zstd", lambda: False)
    with pytest.raises(ValueError, match=r"aiokafka\[zstd\]"):
        KafkaPublisher("k:9092", "rows", settings=KafkaPublisherSettings(compression="zstd"))
    with pytest.raises(ValueError, match="compression must be one of"):
        brotli = KafkaPublisherSettings(compression="brotli")  # type: ignore[arg-type]
        KafkaPublisher("k:9092", "rows", settings=brotli)


def test_kafka_settings_passed_as_client_options_are_refused() -> None:
    """They would reach the producer beside the values the publisher sets from its settings."""
    with pytest.raises(TypeError, match=r"client_id, compression belong in settings="):
        KafkaPublisher("k:9092", "rows", compression="gzip", client_id="me")


# --- helpers ----------------------------------------------------------------------------------


async def test_publish_rows_splits_to_the_publisher_limit() -> None:
    publisher = FakePublisher(max_chunk_bytes=4000)
    await publisher.start()
    ids = np.arange(1000, dtype=np.int64)
    texts = [f"text {i}" for i in range(1000)]
    published = await publish_rows(publisher, "t", {"id": ids, "text": texts}, "arrow", "X")
    assert len(published) > 2
    assert [p.chunk_id for p in published] == [f"X.{i}" for i in range(len(published))]
    assert sum(p.rows for p in published) == 1000
    assert all(p.bytes <= 4000 for p in published)
    columns = reassemble((s.payload, s.attributes) for s in publisher.sent)
    assert columns["id"][0].tolist() == ids.tolist()
    assert columns["text"][0].tolist() == texts


async def test_publish_rows_keeps_one_chunk_when_it_fits() -> None:
    publisher = FakePublisher()
    await publisher.start()
    published = await publish_rows(
        publisher, "t", {"id": [1, 2]}, "json", "orders:7", options=EncodeOptions(ordering_key="k")
    )
    assert [(p.chunk_id, p.rows, p.message_id) for p in published] == [("orders:7", 2, "msg-0")]
    assert publisher.sent[0].key == "k"
    assert publisher.sent[0].attributes[H_ORDERING_KEY] == "k"


async def test_window_bounds_messages_in_flight_and_reports_each() -> None:
    publisher = FakePublisher(delay_s=0.005)
    await publisher.start()
    done: list[str] = []
    window = PublishWindow(publisher, max_in_flight=3, on_done=lambda p: done.append(p.chunk_id))
    for i in range(20):
        await window.submit(_chunk(f"w:{i}"))
        assert window.in_flight <= 3
    await window.drain()
    assert publisher.max_seen_in_flight == 3
    assert sorted(done) == sorted(f"w:{i}" for i in range(20))
    assert [s.attributes[H_CHUNK_ID] for s in publisher.sent] == [f"w:{i}" for i in range(20)]


async def test_window_raises_the_first_failure() -> None:
    publisher = FakePublisher(fail_at=2)
    await publisher.start()
    window = PublishWindow(publisher, max_in_flight=2)
    with pytest.raises(PublishFailed, match="w:2"):
        for i in range(50):
            await window.submit(_chunk(f"w:{i}"))
        await window.drain()
    await window.cancel()
    assert len(publisher.sent) == 2


def test_the_producer_facade_gives_the_defining_modules_names() -> None:
    """``rowbatch.producer`` is the publishing library's one public path besides the defining
    modules: each name it lists is the object its home module defines."""
    import importlib

    import rowbatch.producer

    assert rowbatch.producer.__all__
    for name in rowbatch.producer.__all__:
        home = importlib.import_module(rowbatch.producer._HOMES[name])
        assert getattr(rowbatch.producer, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = rowbatch.producer.no_such_name
