"""The broker clients' own receive cost per message, in-process: aiokafka's record parsing and
the Pub/Sub client's message wrapper, each with the source's conversion to a ``Delivery``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rowbatch.consumer.sources.delivery import Delivery


def broker_costs(messages: Sequence[Delivery], repeat: int) -> dict[str, float]:
    """CPU us per message of the broker clients' receive side, in-process: aiokafka parsing a
    fetched record batch into ``ConsumerRecord`` values plus the Kafka source's conversion to
    a ``Delivery`` (its headers decoded and ``Delivery.of``, the constructor the source uses:
    the per-field dataclass ``__init__`` costs more and would flatter the ratio to it); the
    Pub/Sub client parsing a ``StreamingPullResponse`` and wrapping each message, plus the
    Pub/Sub source's conversion to a ``Delivery``."""
    import queue  # noqa: PLC0415

    from aiokafka.record.default_records import (  # noqa: PLC0415
        DefaultRecordBatch,
        DefaultRecordBatchBuilder,
    )
    from aiokafka.structs import ConsumerRecord  # noqa: PLC0415
    from google.cloud.pubsub_v1.subscriber.message import Message  # noqa: PLC0415
    from google.pubsub_v1 import types as pubsub_types  # noqa: PLC0415

    from rowbatch.wire.headers.fields import kafka_headers_to_attributes  # noqa: PLC0415

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i, d in enumerate(messages):
        headers = [(k, v.encode("utf-8")) for k, v in d.attributes.items()]
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=d.payload, headers=headers)
    kafka_batch = bytes(builder.build())
    received = [
        pubsub_types.ReceivedMessage(
            ack_id=f"ack-{i}",
            message=pubsub_types.PubsubMessage(
                data=d.payload, attributes=dict(d.attributes), message_id=str(i)
            ),
            delivery_attempt=1,
        )
        for i, d in enumerate(messages)
    ]
    pull = pubsub_types.StreamingPullResponse.serialize(
        pubsub_types.StreamingPullResponse(received_messages=received)
    )
    requests: queue.Queue[Any] = queue.Queue()

    def kafka() -> None:
        batch = DefaultRecordBatch(bytearray(kafka_batch))
        for rec in batch:
            record = ConsumerRecord(
                "t", 0, rec.offset, rec.timestamp, rec.timestamp_type, rec.key, rec.value,
                None, len(rec.value or b""), -1, rec.headers,
            )  # fmt: skip
            attributes = kafka_headers_to_attributes(record.headers)
            key = record.key
            Delivery.of(  # as rowbatch/consumer/sources/kafka/records.py's to_delivery
                message_id=f"t/0/{record.offset}",
                payload=bytes(record.value or b""),
                attributes=attributes,
                publish_time=record.timestamp / 1000,
                delivery_attempt=1,
                source="t/0",
                ordering_key=bytes(key).decode("utf-8", errors="replace") if key else "",
                size=len(record.value or b""),
            )

    def pubsub() -> None:
        response = pubsub_types.StreamingPullResponse.pb().FromString(pull)
        for item in response.received_messages:
            message = Message(item.message, item.ack_id, item.delivery_attempt, requests)
            Delivery(
                str(message.message_id),
                bytes(message.data),
                dict(message.attributes),
                float(message.publish_time.timestamp()),
                int(message.delivery_attempt or 0),
                "sub",
                str(message.ordering_key or ""),
                int(message.size),
            )

    out = {}
    for name, func in (("kafka", kafka), ("pubsub", pubsub)):
        best = float("inf")
        for _ in range(repeat):
            started = time.process_time()
            func()
            best = min(best, time.process_time() - started)
        out[name] = best / len(messages) * 1e6
    return out
