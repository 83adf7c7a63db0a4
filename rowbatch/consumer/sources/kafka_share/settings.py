"""The ``[source]`` settings of a Kafka share group (``kind = "kafka-share"``): brokers, topic,
group, members, the record lock, SASL and TLS (:class:`KafkaSecurity`, shared with the classic
Kafka source) and what ``rowbatch-consumer admin ensure`` creates (:class:`KafkaTopicLayout`,
shared too); turned into confluent-kafka's (librdkafka's) configuration of the source's
clients, or, for the tools that read and replay the dead-letter topic, into the classic
source's settings of the same topics (:meth:`KafkaShareSettings.classic_view`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_layout import KafkaTopicLayout
from rowbatch.consumer.sources.kafka_security import KafkaSecurity
from rowbatch.consumer.sources.scaling_settings import ScalingInputs

LOCK_SHARE_FOR_WAIT = 4
"""``model.max_wait_ms`` may take at most 1/4 of a record's lock."""


class KafkaShareSettings(KafkaTopicLayout, KafkaSecurity, ScalingInputs):
    """A topic read as a member of a share group: records are locked to this consumer for
    ``lock_duration_s`` from their delivery, and acknowledged one by one once written
    (accepted), dead-lettered (rejected, after rowbatch's own dead letter is confirmed) or given
    back (released). Experimental: the client (confluent-kafka's ``ShareConsumer``) is
    Preview."""

    kind: Literal["kafka-share"] = "kafka-share"
    bootstrap_servers: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    """The share group."""
    dead_letter_topic: str | None = Field(default=None, min_length=1)
    """Default: ``<topic>.dlq``. Must exist."""
    members: int = Field(default=2, ge=1, le=64)
    """Share consumers in this process, one thread each: a member holds one poll's records
    until every one of them is acknowledged, so two or more keep the pipeline fed."""
    max_poll_records: int = Field(default=500, ge=1)
    """Records one poll brings (a soft bound: the broker may send a little more)."""
    max_delivery_attempts: int = Field(default=4, ge=1)
    """Dead-letter a record (``too-many-attempts``) delivered this many times: keep it below
    the group's ``share.delivery.count.limit`` (the broker's default is 5), so rowbatch
    dead-letters it with its reason before the broker archives it silently."""
    lock_duration_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    """The group's record lock (``share.record.lock.duration.ms``; the broker allows 15-60 s
    by default): what a poll's records may take from delivery to acknowledgement. A record
    acknowledged later was redelivered meanwhile (the result table's keys make the second
    write a no-op). Set on the group when ``configure_group`` is on."""
    configure_group: bool = True
    """At start-up, set the group's ``share.auto.offset.reset`` and
    ``share.record.lock.duration.ms`` (an admin call on the group's configuration); also what
    ``admin ensure`` sets on the group (off: it leaves the group's configuration alone)."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where the group starts on partitions it has not read (Kafka's default is ``latest``:
    records produced before the first member joined are skipped)."""
    dead_letter_timeout_s: float = Field(default=30.0, gt=0)
    check_timeout_s: float = Field(default=10.0, gt=0)
    startup_wait_s: float = Field(default=300.0, ge=0)
    client_id: str = "rowbatch-consumer"
    target_latency_s: float = Field(default=20.0, gt=0)
    """The scaling signal's target (as for the other sources)."""
    lag_interval_s: float = Field(default=15.0, gt=0)
    """How often the share group's lag is read from its coordinator (DescribeShareGroupOffsets,
    Kafka >= 4.2) and exported as ``rowbatch_kafka_share_lag``."""

    @model_validator(mode="after")
    def _attempts(self) -> KafkaShareSettings:
        if self.max_delivery_attempts > 10:
            raise ValueError(
                "max_delivery_attempts above 10: the broker archives a record after at most 10 "
                "deliveries (group.share.delivery.count.limit is 2-10)"
            )
        if self.dead_letter_topic == self.topic:
            raise ValueError(f"dead_letter_topic must differ from topic ({self.topic!r})")
        return self

    def check_fits(self, max_wait_s: float) -> None:
        """A record's lock must outlast its way through the pipeline: its batch's wait
        (``model.max_wait_ms``) may take at most a quarter of it, leaving the rest for the
        request and the write (a record acknowledged after its lock ran out was delivered
        again meanwhile: written twice, the second write a no-op, but work done twice)."""
        if max_wait_s > self.lock_duration_s / LOCK_SHARE_FOR_WAIT:
            raise ValueError(
                f"model.max_wait_ms ({max_wait_s * 1000:g}) is over a quarter of "
                f"source.lock_duration_s ({self.lock_duration_s:g} s): a record would wait "
                "most of its lock before its batch is even sent; lower max_wait_ms or raise "
                "the lock"
            )

    @property
    def dlq_topic(self) -> str:
        return self.dead_letter_topic or f"{self.topic}.dlq"

    @property
    def lock_duration_ms(self) -> int:
        """``lock_duration_s`` as the group's ``share.record.lock.duration.ms``."""
        return int(self.lock_duration_s * 1000)

    def client_config(self) -> dict[str, str | int]:
        """What every client of the source takes (confluent-kafka / librdkafka keys): the
        brokers' address, this client's identity, SASL and TLS (secrets unwrapped);
        ``SourceConfigError`` when a TLS file does not exist."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            **self.librdkafka_security(),
        }

    def classic_view(self) -> KafkaSettings:
        """The classic Kafka source's settings of the same brokers, SASL and TLS, topic,
        dead-letter topic and topic layout: the dead-letter topic is an ordinary topic, read,
        replayed (to ``topic``, where the share group takes the records again) and created by
        the same code as the classic source's (the ``dlq`` commands, ``admin ensure``). Not for
        consuming: its ``group_id`` is the share group's, which no consumer group can join."""
        shared = {
            name: getattr(self, name)
            for name in (*KafkaSecurity.model_fields, *KafkaTopicLayout.model_fields)
        }
        return KafkaSettings(
            bootstrap_servers=self.bootstrap_servers,
            topic=self.topic,
            group_id=self.group_id,
            dead_letter_topic=self.dlq_topic,
            client_id=self.client_id,
            dead_letter_timeout_s=self.dead_letter_timeout_s,
            check_timeout_s=self.check_timeout_s,
            **shared,
        )

    def consumer_config(self) -> dict[str, str | int]:
        """A share consumer's configuration."""
        return {
            **self.client_config(),
            "group.id": self.group_id,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": self.max_poll_records,
        }

    def producer_config(self) -> dict[str, str | int | bool]:
        """The dead-letter producer's configuration (idempotent, every replica's ack)."""
        return {**self.client_config(), "enable.idempotence": True, "acks": "all"}
