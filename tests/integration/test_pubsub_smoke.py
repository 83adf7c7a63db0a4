"""The Pub/Sub service is real: publish, streaming pull, and a dead-letter policy that moves a
message after its max delivery attempts, all through google-cloud-pubsub."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes

from harness.pubsub import PubSubEndpoint

_WAIT_S = 30.0


@pytest.fixture
def clients(
    pubsub: PubSubEndpoint,
) -> Iterator[tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]]:
    publisher, subscriber = pubsub.publisher(), pubsub.subscriber()
    yield publisher, subscriber
    publisher.transport.close()
    subscriber.close()


def _names(pubsub: PubSubEndpoint, stem: str) -> tuple[str, str]:
    unique = f"{stem}-{uuid.uuid4().hex[:8]}"
    return (
        f"projects/{pubsub.project}/topics/{unique}",
        f"projects/{pubsub.project}/subscriptions/{unique}",
    )


def test_publish_and_streaming_pull_round_trip(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
) -> None:
    publisher, subscriber = clients
    topic, subscription = _names(pubsub, "smoke")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=10)

    sent = {f"payload-{i}".encode(): {"seq": str(i), "kind": "smoke"} for i in range(200)}
    futures = [publisher.publish(topic, data, **attrs) for data, attrs in sent.items()]
    message_ids = {f.result(timeout=_WAIT_S) for f in futures}
    assert len(message_ids) == len(sent)

    received: dict[bytes, dict[str, str]] = {}
    lock = threading.Lock()
    all_in = threading.Event()

    def on_message(message: pubsub_v1.subscriber.message.Message) -> None:
        with lock:
            received[message.data] = dict(message.attributes)
            if len(received) == len(sent):
                all_in.set()
        message.ack()

    streaming = subscriber.subscribe(subscription, callback=on_message)
    try:
        assert all_in.wait(_WAIT_S), f"only {len(received)} of {len(sent)} messages arrived"
    finally:
        streaming.cancel()
        streaming.result(timeout=_WAIT_S)
    assert received == sent


def test_dead_letter_policy_moves_message_after_max_attempts(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
) -> None:
    publisher, subscriber = clients
    topic, subscription = _names(pubsub, "dlp")
    dlq_topic, dlq_subscription = _names(pubsub, "dlp-dead")
    publisher.create_topic(name=topic)
    publisher.create_topic(name=dlq_topic)
    subscriber.create_subscription(name=dlq_subscription, topic=dlq_topic)
    max_attempts = 5  # Pub/Sub's smallest allowed value
    subscriber.create_subscription(
        request=pstypes.Subscription(
            name=subscription,
            topic=topic,
            ack_deadline_seconds=10,
            dead_letter_policy=pstypes.DeadLetterPolicy(
                dead_letter_topic=dlq_topic, max_delivery_attempts=max_attempts
            ),
        )
    )
    publisher.publish(topic, b"poison", reason="smoke").result(timeout=_WAIT_S)

    attempts: list[int | None] = []
    dead: list[pubsub_v1.subscriber.message.Message] = []
    arrived = threading.Event()

    def always_nack(message: pubsub_v1.subscriber.message.Message) -> None:
        attempts.append(message.delivery_attempt)
        message.nack()

    def on_dead(message: pubsub_v1.subscriber.message.Message) -> None:
        dead.append(message)
        message.ack()
        arrived.set()

    source = subscriber.subscribe(subscription, callback=always_nack)
    sink = subscriber.subscribe(dlq_subscription, callback=on_dead)
    try:
        assert arrived.wait(_WAIT_S), f"nothing dead-lettered after attempts {attempts}"
    finally:
        for future in (source, sink):
            future.cancel()
            future.result(timeout=_WAIT_S)
    assert dead[0].data == b"poison"
    assert dead[0].attributes["reason"] == "smoke"
    assert len(attempts) == max_attempts
    assert attempts == list(range(1, max_attempts + 1))
