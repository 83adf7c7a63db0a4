"""A fetched Kafka record as the source holds it (``Held``): what holding it costs in memory,
the rows it carries, and the ``Delivery`` it is yielded as."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from rowbatch.consumer.observe.costs import fetched_record_cost
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import H_ROW_COUNT, kafka_headers_to_attributes


@dataclass(eq=False)
class Held:
    """A record taken from the broker and not yet settled."""

    record: Any
    """``aiokafka.structs.ConsumerRecord``."""
    tp: TopicPartition
    epoch: int
    """The assignment of ``tp`` it was fetched under."""
    size: int
    rows: int
    """From its ``rowbatch-row-count`` header (0 when missing or bad)."""
    cost: int = 0
    """What holding it costs while it is read ahead (``record_cost``)."""
    attempt: int = 1


def hold(record: Any, tp: TopicPartition, epoch: int) -> Held:
    """``record`` (fetched under assignment ``epoch`` of ``tp``) as the source holds it: its
    ``record_size``, ``record_rows`` and ``record_cost`` in one pass over its headers."""
    headers = record.headers
    size = len(record.value or b"") + len(record.key or b"")
    rows: int | None = None
    for key, value in headers:
        size += len(key) + len(value or b"")
        if rows is None and key == H_ROW_COUNT:
            rows = _rows_of(value)
    return Held(record, tp, epoch, size, rows or 0, fetched_record_cost(size, len(headers)))


def record_size(record: Any) -> int:
    headers = sum(len(k) + len(v or b"") for k, v in record.headers)
    return len(record.value or b"") + len(record.key or b"") + headers


def record_cost(record: Any, size: int) -> int:
    """What holding ``record`` (of ``size`` bytes) costs while it is read ahead
    (:func:`rowbatch.consumer.observe.costs.fetched_record_cost`)."""
    return fetched_record_cost(size, len(record.headers))


def record_rows(record: Any) -> int:
    for key, value in record.headers:
        if key == H_ROW_COUNT:
            return _rows_of(value)
    return 0


def _rows_of(value: bytes | None) -> int:
    """A ``rowbatch-row-count`` header's value as a count (0 when it is not one)."""
    try:
        return max(0, int(bytes(value or b"").decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        return 0


def work_rows(held: Held) -> int:
    """The rows of work ``held`` carries for the read-ahead's rows bound (at least one)."""
    return held.rows or 1


def to_delivery(held: Held) -> tuple[Delivery, WireError | None]:
    """The delivery ``held`` is yielded as, and why its headers could not be decoded (then
    its attributes are empty and it must be dead-lettered, not yielded), or None."""
    record = held.record
    tp = held.tp
    try:
        attributes = kafka_headers_to_attributes(record.headers)
        bad: WireError | None = None
    except WireError as exc:
        attributes, bad = {}, exc
    timestamp = record.timestamp
    key = record.key
    delivery = Delivery.of(
        message_id=f"{tp.topic}/{tp.partition}/{record.offset}",
        payload=bytes(record.value or b""),
        attributes=attributes,
        publish_time=timestamp / 1000 if timestamp is not None and timestamp >= 0 else time.time(),
        delivery_attempt=held.attempt,
        source=f"{tp.topic}/{tp.partition}",
        ordering_key=bytes(key).decode("utf-8", errors="replace") if key else "",
        size=held.size,
    )
    return delivery, bad


__all__ = [
    "Held",
    "hold",
    "record_cost",
    "record_rows",
    "record_size",
    "to_delivery",
    "work_rows",
]
