"""rowbatch producer: the publishing side. ``publishers`` (Pub/Sub, Kafka, and what they share),
``loadgen`` (generated tables), ``cli`` (the ``rowbatch-producer`` command); the wire contract it
encodes, and the readers of its input tables (CSV, JSON Lines, Parquet, shared with the
consumer's table mode), are :mod:`rowbatch.wire` and :mod:`rowbatch.tables`.

The publishing library's public API is here, each name loaded from the module that defines it
when first used (so importing ``rowbatch.tables`` or the CLI's parser costs no broker
client)::

    from rowbatch.producer import KafkaPublisher, publish_rows

    async with KafkaPublisher("localhost:9092", "rows") as pub:
        await publish_rows(pub, "orders", {"id": ids, "text": texts}, "arrow", "orders-db:1")

This is the one package of ``rowbatch.producer`` that re-exports; code inside ``rowbatch``
imports from the defining modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rowbatch.producer.publishers.base import Publisher
    from rowbatch.producer.publishers.errors import (
        BrokerUnavailable,
        MessageTooLarge,
        PublisherConfigError,
        PublishError,
        PublishFailed,
        TopicNotFound,
    )
    from rowbatch.producer.publishers.kafka import KafkaPublisher
    from rowbatch.producer.publishers.pubsub import PubSubPublisher
    from rowbatch.producer.publishers.retry import PublishRetry
    from rowbatch.producer.publishers.splitting import publish_rows

#: Each public name -> the module that defines it.
_HOMES = {
    "Publisher": "rowbatch.producer.publishers.base",
    "BrokerUnavailable": "rowbatch.producer.publishers.errors",
    "MessageTooLarge": "rowbatch.producer.publishers.errors",
    "PublishError": "rowbatch.producer.publishers.errors",
    "PublishFailed": "rowbatch.producer.publishers.errors",
    "PublisherConfigError": "rowbatch.producer.publishers.errors",
    "TopicNotFound": "rowbatch.producer.publishers.errors",
    "KafkaPublisher": "rowbatch.producer.publishers.kafka",
    "PubSubPublisher": "rowbatch.producer.publishers.pubsub",
    "PublishRetry": "rowbatch.producer.publishers.retry",
    "publish_rows": "rowbatch.producer.publishers.splitting",
}

__all__ = [
    "BrokerUnavailable",
    "KafkaPublisher",
    "MessageTooLarge",
    "PubSubPublisher",
    "PublishError",
    "PublishFailed",
    "PublishRetry",
    "Publisher",
    "PublisherConfigError",
    "TopicNotFound",
    "publish_rows",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
