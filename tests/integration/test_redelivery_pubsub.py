"""Time to redelivery on the real Pub/Sub emulator: a source holding messages nacks them the
way the pipeline does at shutdown (``nack`` for each, then ``close``), and a *new streaming
pull* (a restarted consumer) must get them at once.

Before the fix this took 120 s here (the stream was cancelled, the emulator 0.8.20 kept the
dead stream pulling, and it took the nacked messages for its 60 s stream ack deadline); with
the half-close in ``PubSubSource.close`` it takes well under a second. ``pytest -s`` prints
the measured seconds."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest
from google.pubsub_v1 import types as pstypes

from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource

MESSAGES = 20
BOUND_S = 5.0


@pytest.fixture
def subscription(pubsub: PubSubEndpoint) -> Iterator[str]:
    publisher, subscriber = pubsub.publisher(), pubsub.subscriber()
    unique = uuid.uuid4().hex[:10]
    topic = f"projects/{pubsub.project}/topics/redeliver-{unique}"
    sub = f"projects/{pubsub.project}/subscriptions/redeliver-{unique}"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(
        request=pstypes.Subscription(name=sub, topic=topic, ack_deadline_seconds=60)
    )
    for future in [publisher.publish(topic, f"m{i}".encode()) for i in range(MESSAGES)]:
        future.result(timeout=60)
    yield sub
    subscriber.delete_subscription(subscription=sub)
    publisher.delete_topic(topic=topic)
    publisher.transport.close()
    subscriber.transport.close()


@pytest.mark.parametrize("how", ["pipeline-nacks-then-close", "close-nacks-unsettled"])
async def test_nacked_at_close_reach_a_new_stream_within_bound(
    pubsub: PubSubEndpoint,
    subscription: str,
    how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in pubsub.env().items():
        monkeypatch.setitem(os.environ, key, value)  # the sources build their own clients
    # Default lease settings: a message lost in transit would stay away 60 s.
    config = PubSubSettings(subscription=subscription, dead_letter_topic=None)
    first = PubSubSource(config)
    held: list[Delivery] = []
    iterator = first.deliveries()
    async with asyncio.timeout(60):
        while len(held) < MESSAGES:
            held.append(await anext(iterator))
    if how == "pipeline-nacks-then-close":
        for delivery in held:
            await first.nack(delivery)
    started = time.monotonic()
    await first.close()
    closed_s = time.monotonic() - started

    second = PubSubSource(config)
    seen: set[bytes] = set()
    started = time.monotonic()
    try:
        async with asyncio.timeout(BOUND_S * 12):
            async for delivery in second.deliveries():
                seen.add(delivery.payload)
                await second.ack(delivery)
                if len(seen) == MESSAGES:
                    break
    finally:
        redelivered_s = time.monotonic() - started
        await second.close()
    print(
        f"\nPub/Sub ({pubsub.kind}, {how}): close took {closed_s:.2f} s; a new streaming pull "
        f"had all {MESSAGES} messages back after {redelivered_s:.2f} s"
    )
    assert seen == {f"m{i}".encode() for i in range(MESSAGES)}
    assert redelivered_s <= BOUND_S
