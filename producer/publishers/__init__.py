"""Publishing chunks: a :class:`Publisher` protocol, one module per broker (``pubsub``,
``kafka``), and the helpers the CLI builds on (:func:`publish_rows`, :class:`PublishWindow`).

Both publishers

- check at :meth:`~Publisher.start` that the broker answers (within ``connect_timeout_s``, else
  :class:`BrokerUnavailable` naming the address) and that the topic exists (else
  :class:`TopicNotFound` naming the topic);
- retry transient errors with tenacity (bounded by :class:`PublishRetry`: attempts and seconds)
  and raise permanent ones as :class:`PublishFailed` naming the topic and the chunk id;
- re-send a chunk with the same payload and chunk id on retry, so the consumer, which keys its
  results by chunk id, writes each row once even when a retry duplicates a message;
- report :attr:`~Publisher.max_chunk_bytes`, the largest :attr:`EncodedChunk.size` that fits one
  message, which :func:`publish_rows` hands to :func:`~rowbatch.wire.chunks.split_rows`.

Usage::

    async with KafkaPublisher("localhost:9092", "rows") as pub:
        await publish_rows(pub, "orders", {"id": ids, "text": texts}, "arrow", "orders-db:1")
"""

from __future__ import annotations

from rowbatch.producer.publishers.base import Publisher, StartClose
from rowbatch.producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    PublisherConfigError,
    PublishError,
    PublishFailed,
    TopicNotFound,
)
from rowbatch.producer.publishers.kafka import (
    KafkaCompression,
    KafkaPublisher,
    check_kafka_compression,
)
from rowbatch.producer.publishers.messages import (
    Message,
    PublishedChunk,
    RawMessage,
    chunk_id_of,
    message_size,
    rows_of,
)
from rowbatch.producer.publishers.pubsub import (
    PubSubBatchSettings,
    PubSubFlowControl,
    PubSubPublisher,
    pubsub_topic_path,
)
from rowbatch.producer.publishers.retry import PublishRetry
from rowbatch.producer.publishers.splitting import publish_rows, split_for
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.timing import Sleep

__all__ = [
    "BrokerUnavailable",
    "KafkaCompression",
    "KafkaPublisher",
    "Message",
    "MessageTooLarge",
    "PubSubBatchSettings",
    "PubSubFlowControl",
    "PubSubPublisher",
    "PublishError",
    "PublishFailed",
    "PublishRetry",
    "PublishWindow",
    "PublishedChunk",
    "Publisher",
    "PublisherConfigError",
    "RawMessage",
    "Sleep",
    "StartClose",
    "TopicNotFound",
    "check_kafka_compression",
    "chunk_id_of",
    "message_size",
    "publish_rows",
    "pubsub_topic_path",
    "rows_of",
    "split_for",
]
