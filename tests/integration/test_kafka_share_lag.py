"""The share group's lag as a metric (``kafka_share/lag.py``), on a real Kafka 4.4.0 broker with
share groups: ``ShareLagMonitor`` runs as the source runs it, reading DescribeShareGroupOffsets
v1 every 0.2 s into ``rowbatch_kafka_share_lag``, while plain confluent-kafka ShareConsumers
take the records.

On a two-partition topic whose records all went to partition 0:

- before any member joined, the broker knows no lag (-1): both partitions are NaN, and so is
  the total;
- a member takes a batch and acknowledges none of it; once the batch's lock (1 s) ran out,
  the broker has the group's state, and the gauge is every record produced (none done);
  partition 1, which never had a record, stays NaN and out of the total;
- another member accepts every record: the gauge and the total reach 0."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from prometheus_client import CollectorRegistry

from harness.kafka import KafkaEndpoint, create_topic
from harness.kafka.share import set_share_group_config
from rowbatch.consumer.sources.kafka_share.lag import ShareLagMonitor
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from tests.integration import share_fixtures

share_kafka = share_fixtures.share_kafka  # the fixture, where pytest finds it

pytestmark = pytest.mark.timeout(300)

RECORDS = 30
LOCK_MS = 1000  # group.share.min.record.lock.duration.ms on the share broker
WAIT_S = 60.0


def _produce(endpoint: KafkaEndpoint, topic: str) -> None:
    producer = Producer({"bootstrap.servers": endpoint.bootstrap_servers, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(topic, partition=0, key=str(i).encode(), value=f"record {i}".encode())
    assert producer.flush(WAIT_S) == 0, "records left unsent"


def _member(endpoint: KafkaEndpoint, group: str, topic: str, name: str) -> ShareConsumer:
    consumer = ShareConsumer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "group.id": group,
            "client.id": name,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": 10,
        }
    )
    consumer.subscribe([topic])
    return consumer


def _take_one_batch(consumer: ShareConsumer) -> int:
    """Poll until a batch comes; acknowledge none of it. Its size."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        batch = consumer.poll(0.2)
        if len(batch):
            return len(batch)
    raise AssertionError(f"no records in {WAIT_S:.0f} s")


def _accept_all(consumer: ShareConsumer) -> None:
    """Poll and accept until every record was accepted once; commit."""
    accepted: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    while len(accepted) < RECORDS:
        assert time.monotonic() < deadline, f"{len(accepted)} of {RECORDS} accepted"
        for msg in consumer.poll(0.2):
            assert msg.error() is None, msg.error()
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
            offset = msg.offset()
            assert offset is not None
            accepted.add(offset)
    errors = {tp: exc for tp, exc in consumer.commit_sync(WAIT_S).items() if exc is not None}
    assert errors == {}


class Gauges:
    def __init__(self, registry: CollectorRegistry, topic: str) -> None:
        self._registry, self._topic = registry, topic

    def lag(self, partition: int) -> float | None:
        return self._registry.get_sample_value(
            "rowbatch_kafka_share_lag", {"topic": self._topic, "partition": str(partition)}
        )

    def total(self) -> float | None:
        return self._registry.get_sample_value(
            "rowbatch_kafka_share_lag_total", {"topic": self._topic}
        )

    def failures(self) -> float:
        value = self._registry.get_sample_value(
            "rowbatch_kafka_share_lag_read_failures_total", {"topic": self._topic}
        )
        assert value is not None
        return value

    def updated(self) -> float:
        return (
            self._registry.get_sample_value(
                "rowbatch_kafka_share_lag_updated_timestamp_seconds", {"topic": self._topic}
            )
            or 0.0
        )

    async def until(self, what: str, done: Callable[[], bool]) -> float:
        """Wait for a read after which ``done()``; the seconds it took."""
        started = time.monotonic()
        while not done():
            assert time.monotonic() - started < WAIT_S, (
                f"{what}: not in {WAIT_S:.0f} s (lag {self.lag(0)}, {self.lag(1)}; total "
                f"{self.total()}; {self.failures():.0f} failed reads)"
            )
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async def next_read(self) -> None:
        """Wait for a read that succeeds after now."""
        now = time.time()
        await self.until("a fresh read", lambda: self.updated() > now)


def _nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


async def test_the_gauge_counts_the_records_not_done(share_kafka: KafkaEndpoint) -> None:
    topic, group = f"share-lag-{uuid.uuid4().hex[:8]}", f"share-lag-group-{uuid.uuid4().hex[:8]}"
    await create_topic(share_kafka, topic, partitions=2)
    set_share_group_config(
        share_kafka.bootstrap_servers,
        group,
        share_auto_offset_reset="earliest",
        **{"share.record.lock.duration.ms": str(LOCK_MS)},
    )
    _produce(share_kafka, topic)

    settings = KafkaShareSettings(
        bootstrap_servers=share_kafka.bootstrap_servers,
        topic=topic,
        group_id=group,
        lag_interval_s=0.2,
    )
    registry = CollectorRegistry()
    monitor = ShareLagMonitor(settings, registry)
    gauges = Gauges(registry, topic)
    task = asyncio.create_task(monitor.run())
    try:
        # No member yet: the broker knows no lag (its -1), exported as NaN, never as -1.
        first = await gauges.until("a first read", lambda: gauges.updated() > 0)
        await gauges.next_read()
        assert _nan(gauges.lag(0)) and _nan(gauges.lag(1)) and _nan(gauges.total())
        failed_before = gauges.failures()

        holder = await asyncio.to_thread(_member, share_kafka, group, topic, "holder")
        try:
            held = await asyncio.to_thread(_take_one_batch, holder)
            # Nothing acknowledged: once the batch's lock ran out the group has state, and
            # every record produced is still to do.
            lock_out = await gauges.until(
                "lag == records produced", lambda: gauges.lag(0) == RECORDS
            )
            assert gauges.total() == RECORDS
            assert _nan(gauges.lag(1)), "a partition without records has no state: NaN"
        finally:
            await asyncio.to_thread(holder.close)

        taker = await asyncio.to_thread(_member, share_kafka, group, topic, "taker")
        try:
            await asyncio.to_thread(_accept_all, taker)
        finally:
            await asyncio.to_thread(taker.close)
        drained = await gauges.until("lag 0", lambda: gauges.lag(0) == 0 and gauges.total() == 0)
        assert _nan(gauges.lag(1))
        assert gauges.failures() == failed_before, "a read failed once the group was there"
        assert not monitor.stale
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await monitor.close()
    print(
        f"\nfirst read after {first:.1f} s; {held} of {RECORDS} records held unacknowledged, "
        f"lag {RECORDS} read {lock_out:.1f} s after the poll (lock {LOCK_MS} ms); lag 0 read "
        f"{drained:.1f} s after every record was accepted"
    )
