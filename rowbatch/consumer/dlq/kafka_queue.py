"""The Kafka dead-letter topic as a ``DeadLetterQueue``.

Read by offsets, without a consumer group: every partition is assigned and read from its
beginning to the end offset it had when the command started, so nothing is committed and no
group sees a rebalance. Kafka cannot delete one record, so ``remove`` appends a marker to the
same partition (an empty record whose ``rowbatch-dlq-replayed`` header names the replayed
letter's offset) and every read skips the letters a marker names: reading is two passes, the
markers first. The markers live as long as the topic's retention keeps the letters they name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from rowbatch.consumer.dlq.letters import DeadLetter, text_of
from rowbatch.consumer.dlq.queue import DeadLetterQueueError
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.wire.dead_letter import ATTR_TIME

MARKER: Final = "rowbatch-dlq-replayed"
"""On a marker record: the ``topic/partition/offset`` of the letter that was replayed."""
MARKER_AS: Final = "rowbatch-dlq-replayed-as"
"""On a marker record: where the replay landed (``topic/partition/offset``)."""


def ref_of(record: Any) -> str:
    return f"{record.topic}/{record.partition}/{record.offset}"


def marker_of(record: Any) -> str | None:
    """The letter a marker record names, or None for a dead letter."""
    for key, value in record.headers or ():
        if key == MARKER:
            return bytes(value or b"").decode("utf-8", errors="replace")
    return None


def letter_of(record: Any) -> DeadLetter:
    headers = tuple((k, bytes(v or b"")) for k, v in record.headers or ())
    return DeadLetter(
        ref=ref_of(record),
        payload=bytes(record.value or b""),
        attributes=text_of(headers),
        headers=headers,
        key=record.key,
        queued_at=datetime.fromtimestamp(record.timestamp / 1000, UTC)
        if record.timestamp is not None and record.timestamp >= 0
        else None,
        partition=record.partition,
    )


class KafkaDeadLetterQueue:
    """The dead-letter topic of a Kafka consumer configuration."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        timeout_s: float = 30.0,
        consumer_factory: Callable[..., Any] = AIOKafkaConsumer,
        producer_factory: Callable[..., Any] = AIOKafkaProducer,
    ) -> None:
        self._settings = settings
        self._topic = settings.dlq_topic
        self._timeout_s = timeout_s
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._consumer: Any = None
        self._producer: Any = None

    @property
    def where(self) -> str:
        return f"Kafka topic {self._topic} at {self._settings.bootstrap_servers}"

    @property
    def default_target(self) -> str:
        return self._settings.topic

    async def letters(self) -> AsyncIterator[DeadLetter]:
        consumer, ends = await self._start_reading()
        replayed: set[str] = set()
        async for record in self._read(consumer, ends):
            marker = marker_of(record)
            if marker is not None:
                replayed.add(marker)
        async for record in self._read(consumer, ends):
            if marker_of(record) is None and ref_of(record) not in replayed:
                yield letter_of(record)

    async def _start_reading(self) -> tuple[Any, dict[TopicPartition, int]]:
        options = {
            **self._settings.client_options(),
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_partition_fetch_bytes": self._settings.max_partition_fetch_bytes,
            "fetch_max_bytes": self._settings.fetch_max_bytes,
            "request_timeout_ms": int(self._timeout_s * 1000),
        }
        consumer = self._consumer_factory(**options)
        self._consumer = consumer
        try:
            async with asyncio.timeout(self._timeout_s):
                await consumer.start()
                topics = await consumer.topics()
                if self._topic not in topics:
                    raise DeadLetterQueueError(
                        f"the dead-letter topic {self._topic} does not exist at "
                        f"{self._settings.bootstrap_servers} (rowbatch-consumer admin ensure "
                        "creates it)"
                    )
                # The consumer's own metadata holds only assigned topics; the producer's
                # public partitions_for asks the broker (the topic exists: no auto-creation).
                producer = await self._started_producer()
                partitions = sorted(await producer.partitions_for(self._topic))
                tps = [TopicPartition(self._topic, p) for p in partitions]
                consumer.assign(tps)
                ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        except (KafkaError, OSError, TimeoutError) as exc:
            raise DeadLetterQueueError(
                f"cannot read {self.where}: {_why(exc, self._timeout_s)}"
            ) from exc
        return consumer, ends

    async def _read(self, consumer: Any, ends: dict[TopicPartition, int]) -> AsyncIterator[Any]:
        """Every record from each partition's beginning up to its end offset in ``ends``."""
        try:
            await consumer.seek_to_beginning(*ends)
            left = {tp for tp, end in ends.items() if await consumer.position(tp) < end}
        except (KafkaError, OSError) as exc:
            raise DeadLetterQueueError(f"cannot read {self.where}: {exc!r}") from exc
        loop = asyncio.get_running_loop()
        stalled_from = loop.time()
        while left:
            try:
                batch = await consumer.getmany(*left, timeout_ms=500)
            except (KafkaError, OSError) as exc:
                raise DeadLetterQueueError(f"reading {self.where} failed: {exc!r}") from exc
            if batch:
                stalled_from = loop.time()
            elif loop.time() - stalled_from > self._timeout_s:
                raise DeadLetterQueueError(
                    f"reading {self.where}: nothing for {self._timeout_s:g} s while "
                    f"{sorted(tp.partition for tp in left)} were not read to their end"
                )
            for tp, records in batch.items():
                for record in records:
                    if record.offset < ends[tp]:
                        yield record
            for tp in list(left):
                if await consumer.position(tp) >= ends[tp]:
                    left.discard(tp)

    async def _started_producer(self) -> Any:
        if self._producer is None:
            producer = self._producer_factory(**self._settings.producer_options())
            self._producer = producer
            try:
                async with asyncio.timeout(self._timeout_s):
                    await producer.start()
            except (KafkaError, OSError, TimeoutError) as exc:
                raise DeadLetterQueueError(
                    f"cannot start a producer for {self._settings.bootstrap_servers}: "
                    f"{_why(exc, self._timeout_s)}"
                ) from exc
        return self._producer

    async def _send(self, topic: str, what: str, **record: Any) -> str:
        producer = await self._started_producer()
        try:
            async with asyncio.timeout(self._timeout_s):
                sent = await producer.send(topic, **record)
                meta = await sent
        except (KafkaError, OSError, TimeoutError) as exc:
            raise DeadLetterQueueError(
                f"{what} to {topic} not confirmed: {_why(exc, self._timeout_s)}"
            ) from exc
        return f"{meta.topic}/{meta.partition}/{meta.offset}"

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        return await self._send(
            topic,
            f"publish of {letter.ref}",
            value=letter.payload,
            key=letter.key,
            headers=letter.replay_headers(),
        )

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        await self._send(
            self._topic,
            f"replay marker of {letter.ref}",
            value=b"",
            key=letter.ref.encode(),
            partition=letter.partition,
            headers=[
                (MARKER, letter.ref.encode()),
                (MARKER_AS, replayed_as.encode()),
                (ATTR_TIME, now.encode()),
            ],
        )

    async def close(self) -> None:
        for client in (self._consumer, self._producer):
            if client is not None:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await client.stop()
                except (KafkaError, OSError, TimeoutError):
                    pass  # nothing was consumed or left unconfirmed: stopping is tidying up
        self._consumer = self._producer = None


def _why(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


__all__ = ["MARKER", "KafkaDeadLetterQueue", "letter_of", "marker_of"]
