"""Helpers for tests on the real Kafka broker: topics, producing, reading a topic back, and a
consumer group's committed offsets."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from harness.kafka import KafkaEndpoint, create_topic
from rowbatch.wire.chunks.encode import EncodedChunk

Header = tuple[str, bytes]


@dataclass(frozen=True)
class KafkaTopics:
    endpoint: KafkaEndpoint
    topic: str
    dlq: str
    group: str
    partitions: int

    @classmethod
    async def create(cls, endpoint: KafkaEndpoint, partitions: int = 6) -> KafkaTopics:
        unique = uuid.uuid4().hex[:10]
        t = cls(endpoint, f"in-{unique}", f"in-{unique}.dlq", f"g-{unique}", partitions)
        await create_topic(endpoint, t.topic, partitions)
        await create_topic(endpoint, t.dlq, 1)
        return t

    @property
    def bootstrap(self) -> str:
        return self.endpoint.bootstrap_servers

    def source(self) -> dict[str, Any]:
        """The consumer's ``[source]`` section for this topic and group, with short commit and
        session intervals (a test's restarts and rebalances take seconds, not a minute)."""
        return {
            "kind": "kafka",
            "bootstrap_servers": self.bootstrap,
            "topic": self.topic,
            "group_id": self.group,
            "commit_interval_s": 0.5,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
        }

    def tps(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in range(self.partitions)]


async def produce(
    endpoint: KafkaEndpoint,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes, Sequence[Header]]],
    *,
    partition: int | None = None,
) -> list[Any]:
    """Send records (key, value, headers); return their RecordMetadata, in order."""
    producer = AIOKafkaProducer(
        bootstrap_servers=endpoint.bootstrap_servers, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, value=value, key=key, headers=list(headers), partition=partition
            )
            for key, value, headers in records
        ]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


Record = tuple[bytes | None, bytes, Sequence[Header]]


@contextlib.asynccontextmanager
async def paced_producer(
    endpoint: KafkaEndpoint,
) -> AsyncIterator[Callable[[str, Record], Awaitable[Any]]]:
    """One producer for many sends: ``await send(topic, (key, value, headers))`` returns once
    the broker has the record (its RecordMetadata)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=endpoint.bootstrap_servers, acks="all", enable_idempotence=True
    )
    await producer.start()

    async def send(topic: str, record: Record) -> Any:
        key, value, headers = record
        return await (await producer.send(topic, value=value, key=key, headers=list(headers)))

    try:
        yield send
    finally:
        await producer.stop()


def chunk_record(chunk: EncodedChunk) -> tuple[bytes, bytes, list[Header]]:
    """A chunk as the Kafka publisher sends it: key = chunk id, headers = attributes."""
    return chunk.headers.chunk_id.encode(), chunk.payload, chunk.kafka_headers


async def read_all(
    endpoint: KafkaEndpoint, topic: str, partitions: int = 1, timeout_s: float = 30
) -> list[Any]:
    """Every record of ``topic`` (no group: all partitions, start to end)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=endpoint.bootstrap_servers, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        out: list[Any] = []
        async with asyncio.timeout(timeout_s):
            while True:
                positions = {tp: await consumer.position(tp) for tp in parts}
                if all(positions[tp] >= end[tp] for tp in parts):
                    break
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend(records)
        return out
    finally:
        await consumer.stop()


async def group_offsets(
    endpoint: KafkaEndpoint, topic: str, group: str, partitions: int
) -> tuple[dict[int, int | None], dict[int, int]]:
    """The group's committed offset and the log end offset of each partition."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=endpoint.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        end = await consumer.end_offsets(parts)
        committed = {tp.partition: await consumer.committed(tp) for tp in parts}
        return committed, {tp.partition: off for tp, off in end.items()}
    finally:
        await consumer.stop()
