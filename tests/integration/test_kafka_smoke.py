"""The Kafka broker is real: an idempotent producer (acks=all) writes keyed messages with
headers to a 6-partition topic, a consumer group reads every one back and commits by hand, and
the committed offsets equal the end offsets. A second broker is restarted, cleanly and by a
crash, and keeps its data, its committed offsets and its address."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAlreadyExistsError

from harness.kafka import KafkaEndpoint, KafkaService, create_topic
from harness.service import RunDir

_WAIT_S = 60.0
_PARTITIONS = 6

Record = tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]
"""key, value, headers."""


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _record(i: int) -> Record:
    key = f"key-{i % 24}".encode()
    value = f"payload {i} ✓".encode()
    headers = (("seq", str(i).encode()), ("kind", b"smoke"), ("empty", b""))
    return key, value, headers


async def _produce(endpoint: KafkaEndpoint, topic: str, records: list[Record]) -> list[Any]:
    """Send every record; return each one's RecordMetadata (partition, offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=endpoint.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=int(_WAIT_S * 1000),
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=key, value=value, headers=list(headers))
            for key, value, headers in records
        ]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def _consume_all(
    endpoint: KafkaEndpoint, topic: str, group: str, count: int
) -> tuple[list[Any], dict[TopicPartition, int | None], dict[TopicPartition, int]]:
    """Read ``count`` messages in consumer group ``group``, commit them, and return them with
    the group's committed offsets and the topic's end offsets."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=endpoint.bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        received: list[Any] = []
        async with asyncio.timeout(_WAIT_S):
            while len(received) < count:
                batches = await consumer.getmany(timeout_ms=1000, max_records=500)
                for messages in batches.values():
                    received.extend(messages)
        await consumer.commit()
        partitions = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
        assert consumer.assignment() == set(partitions)
        committed = {tp: await consumer.committed(tp) for tp in partitions}
        end = await consumer.end_offsets(partitions)
        return received, committed, dict(end)
    finally:
        await consumer.stop()


def _by_partition(messages: list[Any]) -> dict[int, list[tuple[int, Record]]]:
    out: dict[int, list[tuple[int, Record]]] = defaultdict(list)
    for m in messages:
        out[m.partition].append((m.offset, (m.key, m.value, tuple(m.headers))))
    return dict(out)


async def test_produce_and_consume_round_trip(kafka: KafkaEndpoint) -> None:
    topic, group = _unique("smoke"), _unique("smoke-group")
    await create_topic(kafka, topic, _PARTITIONS)
    records = [_record(i) for i in range(1200)]

    metadata = await _produce(kafka, topic, records)
    expected: dict[int, list[tuple[int, Record]]] = defaultdict(list)
    for record, meta in zip(records, metadata, strict=True):
        expected[meta.partition].append((meta.offset, record))
    assert set(expected) == set(range(_PARTITIONS)), "24 keys should reach all 6 partitions"

    received, committed, end = await _consume_all(kafka, topic, group, len(records))

    # Exactly what was sent: same keys, values and headers, each at the partition and offset
    # the broker acknowledged, in order within each partition, and nothing more.
    assert len(received) == len(records)
    assert _by_partition(received) == dict(expected)
    # One key, one partition (per-key order is what rowbatch relies on).
    partition_of_key: dict[bytes, set[int]] = defaultdict(set)
    for m in received:
        partition_of_key[m.key].add(m.partition)
    assert all(len(parts) == 1 for parts in partition_of_key.values())

    # The group committed everything: committed offset == end offset on every partition.
    assert committed == end
    assert sum(end.values()) == len(records)


async def test_create_topic_rejects_duplicates_unless_exist_ok(kafka: KafkaEndpoint) -> None:
    topic = _unique("dup")
    await create_topic(kafka, topic, 2)
    await create_topic(kafka, topic, 2, exist_ok=True)
    with pytest.raises(TopicAlreadyExistsError, match=topic):
        await create_topic(kafka, topic, 2)
    with pytest.raises(ValueError, match="exists with 2 partitions, not 3"):
        await create_topic(kafka, topic, 3, exist_ok=True)


@pytest.fixture
def restartable_kafka(run_dir: RunDir) -> Iterator[KafkaService]:
    """A second broker of our own (the session one must not restart under other tests)."""
    service = KafkaService(run_dir, name="kafka-restart")
    with service:
        yield service


async def test_restart_keeps_data_offsets_and_address(restartable_kafka: KafkaService) -> None:
    service = restartable_kafka
    before = service.endpoint
    assert before is not None
    topic, group = _unique("restart"), _unique("restart-group")
    await create_topic(before, topic, _PARTITIONS)
    first = [_record(i) for i in range(300)]
    await _produce(before, topic, first)
    _, committed, end = await _consume_all(before, topic, group, len(first))
    assert committed == end

    # A controlled shutdown, then a crash (SIGKILL): both come back with everything.
    clean = await asyncio.to_thread(service.restart)
    crashed = await asyncio.to_thread(service.restart, crash=True)
    for after in (clean, crashed):
        assert after.bootstrap_servers == before.bootstrap_servers
        assert after.log_dir == before.log_dir
    assert len({before.pid, clean.pid, crashed.pid}) == 3

    second = [_record(i) for i in range(300, 420)]
    await _produce(crashed, topic, second)
    # The group resumes from its committed offsets: it sees only the new messages.
    received, committed, end = await _consume_all(crashed, topic, group, len(second))
    assert sorted(m.value for m in received) == sorted(value for _, value, _ in second)
    assert committed == end
    assert sum(end.values()) == len(first) + len(second)
