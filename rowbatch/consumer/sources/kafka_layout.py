"""``KafkaTopicLayout``: the ``[source]`` fields that say how ``rowbatch-consumer admin ensure``
creates (and checks) a Kafka source's topic and dead-letter topic, shared by both Kafka sources
(``kind = "kafka"`` and ``kind = "kafka-share"``) and declared once. The consumers themselves
do not read them."""

from __future__ import annotations

from pydantic import Field

from rowbatch.consumer.section import Section

_DAY_MS = 24 * 3600 * 1000


class KafkaTopicLayout(Section):
    """The topic and dead-letter topic as ``admin ensure`` makes them."""

    partitions: int = Field(default=6, ge=1)
    """The topic's partition count: also the most consumer replicas that get work (an
    autoscaler's cap), on a consumer group (``kind = "kafka"``); a share group's members are
    not bounded by it."""
    replication_factor: int = Field(default=3, ge=1, le=32767)
    """Of the topic and its dead-letter topic (1 on a single-broker cluster)."""
    retention_ms: int = Field(default=7 * _DAY_MS, ge=-1)
    """``retention.ms`` of the topic and its dead-letter topic (-1: forever)."""
    dead_letter_partitions: int = Field(default=1, ge=1)
    """The dead-letter topic's partition count (dead letters are few)."""


__all__ = ["KafkaTopicLayout"]
