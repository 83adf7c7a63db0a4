"""Kafka dead letters: the record as it came (key, value, headers) plus the ``rowbatch-dlq-*``
headers of ``rowbatch.wire.dead_letter``, published to the dead-letter topic and confirmed by the
broker.

Dead letters go to ``dead_letter_topic`` (``<topic>.dlq`` by default) through an idempotent
producer (``acks=all``): the original key, value and headers plus ``rowbatch-dlq-*`` headers
(reason, code, message, source ``topic/partition``, message id ``topic/partition/offset``,
topic, partition, offset, group, attempt, consumer version, time). The record is settled only
once the broker confirmed the write; a failed or timed-out publish raises
:class:`DeadLetterFailed` and leaves it unsettled (the pipeline then nacks it). At least once:
a publish that timed out may still land, and a record whose partition was revoked during the
publish is dead-lettered again by its next owner. Records whose headers are not UTF-8 (they
cannot become ``Delivery.attributes``) are dead-lettered by the source itself as
``undecodable`` and never yielded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka.errors import KafkaError

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.errors import DeadLetterFailed, KafkaSourceError
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_GROUP,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_OFFSET,
    ATTR_PARTITION,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
    ATTR_TOPIC,
)


@dataclass(frozen=True)
class RowPartRecord:
    """A row part of a fetched record, dead-lettered in its place: the record's key and place,
    the part's value and headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


DLQ_MESSAGE_MAX_BYTES = 1024
"""The reason message is cut to this many UTF-8 bytes."""


def dead_letter_headers(
    record: Any,
    delivery: Delivery,
    reason: DeadLetterReason,
    *,
    group_id: str,
    consumer_version: str,
) -> list[tuple[str, bytes]]:
    """The original headers of ``record`` (bytes as they were) plus the ``rowbatch-dlq-*``
    ones (ours replace any of the same name)."""
    message = reason.message.encode("utf-8")[:DLQ_MESSAGE_MAX_BYTES]
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    ours = {
        ATTR_REASON: reason.reason_class.value,
        ATTR_CODE: reason.code,
        ATTR_MESSAGE: message.decode("utf-8", errors="ignore"),
        ATTR_SOURCE: delivery.source,
        ATTR_MESSAGE_ID: delivery.message_id,
        ATTR_TOPIC: record.topic,
        ATTR_PARTITION: str(record.partition),
        ATTR_OFFSET: str(record.offset),
        ATTR_GROUP: group_id,
        ATTR_DELIVERY_ATTEMPT: str(delivery.delivery_attempt),
        ATTR_CONSUMER_VERSION: consumer_version,
        ATTR_TIME: now,
    }
    headers = [(k, bytes(v or b"")) for k, v in record.headers if k not in ours]
    headers += [(k, v.encode("utf-8")) for k, v in ours.items()]
    return headers


async def publish_dead_letter(
    producer: Callable[[], Awaitable[Any]],
    topic: str,
    record: Any,
    headers: list[tuple[str, bytes]],
    *,
    message_id: str,
    timeout_s: float,
) -> None:
    """Send ``record``'s key and value with ``headers`` to ``topic`` through the (started)
    producer that ``producer()`` returns and wait up to ``timeout_s`` for the broker's
    confirmation. Raises ``DeadLetterFailed`` naming ``message_id`` when it does not come."""
    try:
        started = await producer()
        async with asyncio.timeout(timeout_s):
            sent = await started.send(topic, value=record.value, key=record.key, headers=headers)
            await sent
    except (KafkaError, OSError, TimeoutError, KafkaSourceError) as exc:
        raise DeadLetterFailed(
            f"dead-letter publish of {message_id} to {topic} failed: {type(exc).__name__}: {exc}"
        ) from exc


__all__ = ["DLQ_MESSAGE_MAX_BYTES", "RowPartRecord", "dead_letter_headers", "publish_dead_letter"]
