"""Time to redelivery on the real Kafka broker: a group member holding records nacks them the
way the pipeline does at shutdown, then closes (commit what is committable, LeaveGroup); a new
member of the same group must get the nacked records at once, not after the session timeout.
``pytest -s`` prints the measured seconds."""

from __future__ import annotations

import time

from harness.kafka import KafkaEndpoint
from rowbatch.consumer.sources.kafka.source import KafkaSource
from tests.integration.kafka_helpers import KafkaTopics, group_offsets, produce
from tests.integration.test_source_kafka import records, source_config, take

BOUND_S = 10.0


async def test_nacked_at_close_go_to_the_next_member_within_bound(kafka: KafkaEndpoint) -> None:
    topics = await KafkaTopics.create(kafka, partitions=1)
    await produce(kafka, topics.topic, records(10))
    # A long session: without LeaveGroup the next member would wait for it to run out.
    config = source_config(topics, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)
    first = KafkaSource(config)
    await first.check()
    got = await take(first, 10)
    for d in got[:4]:
        await first.ack(d)
    for d in got[4:]:
        await first.nack(d)  # the pipeline's shutdown nacks
    started = time.monotonic()
    await first.close()
    closed_s = time.monotonic() - started
    offsets, _ = await group_offsets(kafka, topics.topic, topics.group, 1)
    assert offsets == {0: 4}, "committed what was done, not past the first nacked record"

    second = KafkaSource(config)
    started = time.monotonic()
    try:
        await second.check()
        again = await take(second, 6, timeout_s=BOUND_S * 6)
    finally:
        redelivered_s = time.monotonic() - started
        await second.close()
    print(
        f"\nKafka: close took {closed_s:.2f} s; the next member had the 6 nacked records "
        f"after {redelivered_s:.2f} s (session timeout 30 s)"
    )
    assert [d.message_id.rsplit("/", 1)[1] for d in again] == [str(i) for i in range(4, 10)]
    assert redelivered_s <= BOUND_S
