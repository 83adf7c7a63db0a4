"""Publishing to the Pub/Sub emulator, what only Pub/Sub has: parts near its 10 MB message limit
are accepted. What both brokers share is in test_publish.py."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from harness.pubsub import PubSubEndpoint
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.producer.publishers.splitting import publish_rows
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.split import PUBSUB_MAX_MESSAGE_BYTES
from tests.integration.publish_helpers import PubSubPublishBroker, pubsub_publish_broker


@pytest.fixture
def broker(pubsub: PubSubEndpoint) -> Iterator[PubSubPublishBroker]:
    yield from pubsub_publish_broker(pubsub)


async def test_parts_near_the_10_mb_limit_are_accepted(broker: PubSubPublishBroker) -> None:
    topic = await broker.topic("big")
    n = 24_000
    texts = [f"{i:08d}" + "x" * 1000 for i in range(n)]
    async with PubSubPublisher(broker.path(topic), emulator_host=broker.endpoint.host) as publisher:
        done = await publish_rows(
            publisher, "big", {"id": np.arange(n), "text": texts}, "arrow", "big:1"
        )
    parts = [(p.chunk_id, p.rows, p.bytes) for p in done]
    assert [p[0] for p in parts] == ["big:1.0", "big:1.1", "big:1.2"]
    assert all(9_000_000 < size <= PUBSUB_MAX_MESSAGE_BYTES for _, _, size in parts[:2])
    messages = await broker.read(topic, rows=n)
    got = sorted(
        (t for m in messages for t in decode_chunk(m.data, m.attributes).columns["text"]),
    )
    assert got == texts
