"""The ``[source]`` settings of an Apache Kafka topic (``kind = "kafka"``): brokers, topic, group,
commit/retry/rebalance timings, read-ahead bounds, SASL and TLS, the autoscaling figure's
inputs, and what ``rowbatch-consumer admin ensure`` creates. The one settings type:
``KafkaSource`` takes it as it is, and turns it into the options of its two aiokafka clients."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, model_validator

from rowbatch.consumer.section import MiB
from rowbatch.consumer.sources.kafka.errors import KafkaConfigError
from rowbatch.consumer.sources.kafka_layout import KafkaTopicLayout
from rowbatch.consumer.sources.kafka_security import KafkaSecurity
from rowbatch.consumer.sources.scaling_settings import ScalingInputs

FETCH_BUDGET_SHARE: Final = 32
"""Unless ``fetch_max_bytes`` is set, a fetch response brings at most this fraction of the
consumer's ``budget_bytes`` (at least ``MIN_FETCH_BYTES``): aiokafka holds what it fetched, and
its parsed records, in its own buffers before the source takes any of them (outside the
source's read-ahead count), at several times the raw bytes for small records. Measured with
30,000 1-row messages under a 16 MiB budget (tests/integration/test_memory_small_messages.py):
peak RSS over RSS once ready 43-67 MiB with 16 MiB fetches (aiokafka's default is 50), 44 MiB
with 4 MiB, 31-34 MiB with 1 MiB, 25-30 MiB with 512 KiB (this cap), 22 MiB with 384 KiB, at
the same speed."""
MIN_FETCH_BYTES: Final = 64 * 1024


class KafkaSettings(KafkaTopicLayout, KafkaSecurity, ScalingInputs):
    """An Apache Kafka topic read as a consumer-group member (offsets committed by the
    consumer, per partition, only below records that are written or dead-lettered). See
    ``sources/kafka/source.py`` for how commits, rebalances, pauses and retries work. The
    autoscaling inputs shared with Pub/Sub are :class:`ScalingInputs`; SASL and TLS
    (:class:`KafkaSecurity`) and what ``admin ensure`` creates (:class:`KafkaTopicLayout`)
    are shared with the share-group source."""

    kind: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1)
    """``host:port[,host:port...]``."""
    topic: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    dead_letter_topic: str | None = Field(default=None, min_length=1)
    """Default: ``<topic>.dlq``. Must exist."""
    max_delivery_attempts: int | None = Field(default=5, ge=1)
    """Dead-letter a record (``too-many-attempts``) after this many local deliveries; nacked
    records are re-delivered by this consumer with a growing delay (``redelivery_backoff_s``
    doubling up to ``redelivery_backoff_max_s``). None: retry forever."""
    redelivery_backoff_s: float = Field(default=1.0, gt=0)
    redelivery_backoff_max_s: float = Field(default=30.0, gt=0)
    commit_interval_s: float = Field(default=1.0, gt=0)
    """The offset commit interval: how often this consumer commits the group's completed
    offsets to Kafka (also on rebalance and shutdown). Not the sink's commit interval
    (``[sink] commit_interval_s``, Parquet and Iceberg), which bounds when written rows become
    visible; an offset is committed only once its rows are durable in the sink."""
    commit_timeout_s: float = Field(default=10.0, gt=0)
    """How long one offset commit may take (a revoke's commit included)."""
    revoke_grace_s: float = Field(default=5.0, ge=0)
    """On a rebalance, how long to wait for in-flight records of revoked partitions."""
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3_000, ge=100)
    max_poll_interval_ms: int = Field(default=300_000, ge=1000)
    rebalance_timeout_ms: int = Field(default=30_000, ge=1000)
    """Must exceed ``revoke_grace_s`` plus ``commit_timeout_s``, or a revoke would get this
    member expelled from the group."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a group without committed offsets starts."""
    max_buffered_records: int = Field(default=2000, ge=1)
    """Records fetched ahead of the pipeline; fetching pauses beyond this."""
    max_buffered_rows: int | None = Field(default=None, ge=1)
    """Rows fetched ahead of the pipeline (from each record's row count). None: two target
    batches per request in flight (``model.batch_size`` x ``model.max_in_flight`` x 2), so a
    rebalance finds a batch or two in hand, not the backlog."""
    max_buffered_bytes: int = Field(default=64 * MiB, ge=1024)
    """What records fetched ahead of the pipeline may cost (their bytes plus ~1 KB of objects
    each, measured); fetching pauses beyond this. The read-ahead is also held in
    ``budget_bytes`` and takes at most a quarter of it."""
    max_partition_fetch_bytes: int = Field(default=MiB, ge=1024)
    """At least the topic's ``max.message.bytes``."""
    fetch_max_bytes: int = Field(default=16 * MiB, ge=1024)
    """Most bytes one fetch response brings (aiokafka's ``fetch_max_bytes``). Unless set, at
    most a 32nd of ``budget_bytes`` (:meth:`within_budget`); the broker still returns a first
    record batch larger than this, so a large message is never stuck."""
    max_poll_records: int = Field(default=500, ge=1)
    """Most records taken from the client per poll (also bounded by the read-ahead room)."""
    client_id: str = "rowbatch-consumer"
    lag_interval_s: float = Field(default=5.0, gt=0)
    """How often per-partition lag is measured and exported."""
    target_latency_s: float = Field(default=20.0, gt=0)
    """For ``rowbatch_desired_replicas``: how long the backlog may take to clear
    (docs/autoscaling.md: 20 s holds a 30 s objective)."""
    dead_letter_timeout_s: float = Field(default=30.0, gt=0)
    """How long a dead letter's produce may take to be acknowledged by the brokers (else the
    record is nacked, not committed)."""
    check_timeout_s: float = Field(default=10.0, gt=0)
    """How long the start-up check (and a client's start) waits for the brokers. Joining the
    group may take longer (:attr:`join_timeout_s`)."""
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for brokers that do not answer (retrying with backoff, as for
    the model server and the sink) before giving up with an error: a broker that restarts
    with the consumer is not a reason to exit."""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        revoke_ms = (self.revoke_grace_s + self.commit_timeout_s) * 1000
        if revoke_ms >= self.rebalance_timeout_ms:
            raise ValueError(
                f"rebalance_timeout_ms ({self.rebalance_timeout_ms} ms) must exceed "
                f"revoke_grace_s + commit_timeout_s ({revoke_ms / 1000:g} s), or a revoke "
                f"would get this member expelled from the group"
            )
        if self.dead_letter_topic == self.topic:
            raise ValueError(f"dead_letter_topic must differ from topic ({self.topic!r})")
        return self

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic: ``dead_letter_topic``, else ``<topic>.dlq``."""
        return self.dead_letter_topic or f"{self.topic}.dlq"

    def client_options(self) -> dict[str, Any]:
        """What both aiokafka clients take: address, identity, security (secrets unwrapped);
        ``KafkaConfigError`` when the TLS files cannot be used."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.sasl:
            assert self.sasl_plain_password is not None  # checked above
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_plain_username,
                sasl_plain_password=self.sasl_plain_password.get_secret_value(),
            )
        if self.tls:
            options["ssl_context"] = self._ssl_context()
        return options

    def _ssl_context(self) -> ssl.SSLContext:
        from aiokafka.helpers import create_ssl_context  # noqa: PLC0415 (lazy: the client)

        files = {
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        password = self.ssl_key_password
        try:
            context: ssl.SSLContext = create_ssl_context(
                cafile=_text(self.ssl_cafile),
                certfile=_text(self.ssl_certfile),
                keyfile=_text(self.ssl_keyfile),
                password=None if password is None else password.get_secret_value(),
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            named = ", ".join(f"{k}={v}" for k, v in files.items() if v) or "system CAs"
            raise KafkaConfigError(f"cannot build the TLS context ({named}): {exc}") from exc
        return context

    @property
    def join_timeout_s(self) -> float:
        """How long starting the consumer may wait to join the group and get its partitions:
        a rebalance waits for every member to rejoin (up to ``rebalance_timeout_ms``) and for
        a member that died to be dropped (``session_timeout_ms``), so a member restarted
        right after a crash may wait for both."""
        return self.check_timeout_s + (self.session_timeout_ms + self.rebalance_timeout_ms) / 1000

    def within_budget(self, budget_bytes: int) -> KafkaSettings:
        """These settings for a consumer with ``budget_bytes``: ``fetch_max_bytes``, unless
        set, at most ``budget_bytes / FETCH_BUDGET_SHARE`` (see there)."""
        if "fetch_max_bytes" in self.model_fields_set:
            return self
        cap = max(MIN_FETCH_BYTES, budget_bytes // FETCH_BUDGET_SHARE)
        if self.fetch_max_bytes <= cap:
            return self
        return self.model_copy(update={"fetch_max_bytes": cap})

    def consumer_options(self) -> dict[str, Any]:
        return {
            **self.client_options(),
            "group_id": self.group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": self.auto_offset_reset,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_poll_interval_ms": self.max_poll_interval_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "max_partition_fetch_bytes": self.max_partition_fetch_bytes,
            "fetch_max_bytes": self.fetch_max_bytes,
        }

    def producer_options(self) -> dict[str, Any]:
        return {
            **self.client_options(),
            "acks": "all",
            "enable_idempotence": True,
            # A dead letter is the original record plus ~1 KB of headers: let the broker
            # (the dead-letter topic's max.message.bytes) be the judge, not the client.
            "max_request_size": self.max_partition_fetch_bytes + 64 * 1024,
            "request_timeout_ms": int(self.dead_letter_timeout_s * 1000),
        }


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)
