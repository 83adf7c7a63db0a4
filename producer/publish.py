"""The stable import path of the publishing API: ``from rowbatch.producer.publish import
KafkaPublisher, publish_rows, ...`` keeps working; the code lives in
:mod:`rowbatch.producer.publishers` (one module per broker, with their shared errors, retry policy,
message types, splitting and publish window).
"""

from __future__ import annotations

from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
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
    "RawMessage",
    "Sleep",
    "TopicNotFound",
    "check_kafka_compression",
    "chunk_id_of",
    "message_size",
    "publish_rows",
    "pubsub_topic_path",
    "rows_of",
    "split_for",
]
