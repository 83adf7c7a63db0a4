"""Time to redelivery on each real broker: a consumer holding messages gives back what it did not
settle when it stops, the way the pipeline does at shutdown (``nack`` for each, then
``close``), or by ``close`` alone (Pub/Sub: ``close`` nacks what is unsettled), and the next
consumer on the same subscription or group must get those messages at once, not after a lease
or a session runs out. ``pytest -s`` prints the measured seconds.

Kafka: the member acks the first records and nacks the rest, then closes (commit what is
committable, LeaveGroup); the group's committed offset stops at the first nacked record, and a
new member of the same group gets the nacked records, in order, well before its 30 s session
timeout. Pub/Sub: a new *streaming pull* (a restarted consumer) gets every message back. Before
the fix this took 120 s there (the stream was cancelled, the emulator 0.8.20 kept the dead
stream pulling, and it took the nacked messages for its 60 s stream ack deadline); with the
half-close in ``PubSubSource.close`` it takes well under a second."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import pytest
from google.pubsub_v1 import types as pstypes

from harness.kafka import KafkaEndpoint
from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.sources.base import Source
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource
from tests.integration.kafka_helpers import KafkaTopics, group_offsets, produce
from tests.integration.pubsub_helpers import use_emulator
from tests.integration.test_source_kafka import records, source_config

WAIT_S = 60.0
"""Time for the first consumer to receive every message, and the most the second may take
(beyond its bound) before the test gives up."""


class Broker(Protocol):
    """A fresh topic with messages waiting on one broker, and consumers of it."""

    name: str
    bound_s: float
    """The next consumer has what was given back within this."""
    acked: int
    """How many of the held messages the first consumer acks before it stops."""
    ordered: bool
    """The given-back messages come again once each and in order (one partition)."""
    checked: bool
    """Each consumer runs its start-up ``check`` first (Pub/Sub's refuses a subscription
    without a dead-letter topic or policy, as this one is)."""

    async def publish(self) -> dict[str, bytes]:
        """Publishes the messages; returns each one's ``Delivery.message_id`` and payload, in
        publishing order."""
        ...

    def source(self) -> Source: ...

    async def after_close(self) -> None:
        """What the broker must hold once the first consumer closed."""
        ...

    def close(self) -> None: ...


@dataclass
class KafkaBroker:
    """One partition; the members have a 30 s session, so a member that did not leave the group
    would keep the partition for 30 s."""

    topics: KafkaTopics
    name: str = "Kafka"
    bound_s: float = 10.0
    acked: int = 4
    ordered: bool = True
    checked: bool = True
    messages: int = 10

    async def publish(self) -> dict[str, bytes]:
        sent = records(self.messages)
        meta = await produce(self.topics.endpoint, self.topics.topic, sent)
        return {
            f"{m.topic}/{m.partition}/{m.offset}": value
            for m, (_, value, _) in zip(meta, sent, strict=True)
        }

    def source(self) -> Source:
        return KafkaSource(
            source_config(self.topics, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)
        )

    async def after_close(self) -> None:
        t = self.topics
        offsets, _ = await group_offsets(t.endpoint, t.topic, t.group, 1)
        assert offsets == {0: self.acked}, "committed what was done, not past the first nacked"

    def close(self) -> None:
        pass


@dataclass
class PubSubBroker:
    """A subscription with a 60 s ack deadline and the default lease settings: a message lost
    in transit would stay away 60 s."""

    endpoint: PubSubEndpoint
    name: str = "Pub/Sub"
    bound_s: float = 5.0
    acked: int = 0
    ordered: bool = False
    checked: bool = False
    messages: int = 20

    def __post_init__(self) -> None:
        self.publisher, self.subscriber = self.endpoint.publisher(), self.endpoint.subscriber()
        unique = uuid.uuid4().hex[:10]
        project = self.endpoint.project
        self.topic = f"projects/{project}/topics/redeliver-{unique}"
        self.subscription = f"projects/{project}/subscriptions/redeliver-{unique}"
        self.publisher.create_topic(name=self.topic)
        self.subscriber.create_subscription(
            request=pstypes.Subscription(
                name=self.subscription, topic=self.topic, ack_deadline_seconds=60
            )
        )

    async def publish(self) -> dict[str, bytes]:
        payloads = [f"m{i}".encode() for i in range(self.messages)]

        def send() -> list[str]:
            futures = [self.publisher.publish(self.topic, p) for p in payloads]
            return [f.result(timeout=60) for f in futures]

        ids = await asyncio.to_thread(send)
        return dict(zip(ids, payloads, strict=True))

    def source(self) -> Source:
        return PubSubSource(PubSubSettings(subscription=self.subscription, dead_letter_topic=None))

    async def after_close(self) -> None:
        pass

    def close(self) -> None:
        self.subscriber.delete_subscription(subscription=self.subscription)
        self.publisher.delete_topic(topic=self.topic)
        self.publisher.transport.close()
        self.subscriber.transport.close()


@pytest.fixture(params=["kafka", "pubsub"])
async def broker(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Broker]:
    made: Broker
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        made = KafkaBroker(await KafkaTopics.create(kafka, partitions=1))
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        use_emulator(pubsub, monkeypatch)  # the sources build their own clients
        made = await asyncio.to_thread(PubSubBroker, pubsub)
    try:
        yield made
    finally:
        await asyncio.to_thread(made.close)


async def _hold(source: Source, n: int) -> list[Delivery]:
    held: list[Delivery] = []
    iterator = source.deliveries()
    async with asyncio.timeout(WAIT_S):
        while len(held) < n:
            held.append(await anext(iterator))
    return held


async def _until_all(source: Source, want: Sequence[str], within_s: float) -> list[Delivery]:
    """Deliveries (each acked) until every id of ``want`` came at least once."""
    got: list[Delivery] = []
    missing = set(want)
    async with asyncio.timeout(within_s):
        async for delivery in source.deliveries():
            got.append(delivery)
            missing.discard(delivery.message_id)
            await source.ack(delivery)
            if not missing:
                break
    return got


@pytest.mark.parametrize(
    ("broker", "how"),
    [
        ("kafka", "pipeline-nacks-then-close"),
        ("pubsub", "pipeline-nacks-then-close"),
        ("pubsub", "close-nacks-unsettled"),
    ],
    indirect=["broker"],
)
async def test_what_is_given_back_at_close_reaches_the_next_consumer_within_bound(
    broker: Broker, how: str
) -> None:
    sent = await broker.publish()
    first = broker.source()
    try:
        if broker.checked:
            await first.check()
        held = await _hold(first, len(sent))
        for delivery in held[: broker.acked]:
            await first.ack(delivery)
        if how == "pipeline-nacks-then-close":
            for delivery in held[broker.acked :]:
                await first.nack(delivery)  # the pipeline's shutdown nacks
    finally:
        started = time.monotonic()
        await first.close()
        closed_s = time.monotonic() - started
    assert sorted(d.message_id for d in held) == sorted(sent)
    await broker.after_close()

    given_back = [d.message_id for d in held[broker.acked :]]
    second = broker.source()
    started = time.monotonic()
    try:
        if broker.checked:
            await second.check()
        again = await _until_all(second, given_back, WAIT_S)
    finally:
        redelivered_s = time.monotonic() - started
        await second.close()
    print(
        f"\n{broker.name} ({how}): close took {closed_s:.2f} s; the next consumer had the "
        f"{len(given_back)} given-back messages after {redelivered_s:.2f} s"
    )
    assert {d.message_id for d in again} == set(given_back)
    assert all(d.payload == sent[d.message_id] for d in again)
    if broker.ordered:
        assert [d.message_id for d in again] == given_back
    assert redelivered_s <= broker.bound_s
