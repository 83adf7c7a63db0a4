"""The stable import path of the publishing API: ``from producer.publish import KafkaPublisher,
publish_rows, ...`` keeps working; the code lives in :mod:`producer.publishers` (one module per
broker, with their shared errors, retry policy, message types, splitting and publish window).
"""

from __future__ import annotations

from producer.publishers.base import Publisher
from producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    PublishError,
    PublishFailed,
    TopicNotFound,
)
from producer.publishers.kafka import KafkaCompression, KafkaPublisher, check_kafka_compression
from producer.publishers.messages import (
    Message,
    PublishedChunk,
    RawMessage,
    chunk_id_of,
    message_size,
    rows_of,
)
from producer.publishers.pubsub import (
    PubSubBatchSettings,
    PubSubFlowControl,
    PubSubPublisher,
    pubsub_topic_path,
)
from producer.publishers.retry import RetryPolicy, Sleep
from producer.publishers.splitting import publish_rows, split_for
from producer.publishers.window import PublishWindow

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
    "PublishWindow",
    "PublishedChunk",
    "Publisher",
    "RawMessage",
    "RetryPolicy",
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
