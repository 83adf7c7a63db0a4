"""The ``[source]`` section of the consumer configuration: a Pub/Sub subscription or a Kafka
topic, with what ``rowbatch-consumer admin ensure`` creates for it (topics, the subscription's
ack deadline, retry and dead-letter policies, partitions, replication, retention)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

_TOPIC = r"^projects/[^/]+/topics/[^/]{3,}$"
_SUBSCRIPTION = r"^projects/[^/]+/subscriptions/[^/]{3,}$"
_DAY_MS = 24 * 3600 * 1000

MiB = 1024 * 1024


class Section(BaseModel):
    """A config section: frozen, and an unknown field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PubSubSettings(Section):
    kind: Literal["pubsub"] = "pubsub"
    subscription: str = Field(pattern=_SUBSCRIPTION)
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None = Field(default=None, pattern=_TOPIC)
    """Full path of the topic poison messages go to (``projects/P/topics/T``). May be left out
    only when the subscription has its own dead-letter policy (poison is then nacked until
    Pub/Sub moves it)."""
    max_messages: int = Field(default=1000, ge=1)
    """Flow control: most messages held (leased, not yet acked) at once."""
    max_bytes: int = Field(default=64 * MiB, ge=1024)
    """Flow control: most payload bytes held at once."""
    max_lease_duration_s: float = Field(default=3600.0, gt=0)
    """How long a held message's ack deadline keeps being extended; must exceed the worst
    batch time plus backoff."""
    max_lease_extension_s: float = Field(default=60.0, ge=10, le=600)
    """Longest single ack-deadline extension: bounds how long a crashed consumer's messages
    wait before Pub/Sub redelivers them."""
    max_delivery_attempts: int | None = Field(default=None, ge=1)
    """Dead-letter a message delivered more often than this (needs a subscription with a
    dead-letter policy, which is what makes Pub/Sub count attempts)."""
    mode: Literal["pull", "streaming"] = "pull"
    """``pull``: unary Pull calls with batched acks and leases kept by rowbatch
    (``consumer/sources/pubsub/pull.py``; ~10x less CPU per message, see README "Pub/Sub pull
    mode"); ``streaming``: google-cloud-pubsub's streaming pull
    (``sources/pubsub/streaming.py``)."""
    pull_concurrency: int = Field(default=2, ge=1, le=16)
    """Pull mode: Pull calls in flight at once."""
    pull_max_messages: int = Field(default=1000, ge=1, le=1000)
    """Pull mode: most messages one Pull asks for (also bounded by ``max_messages``)."""
    ack_delay_ms: float = Field(default=10.0, ge=0, le=1000)
    """Pull mode: longest an ack/nack waits to share an Acknowledge/ModifyAckDeadline call
    (up to 1,000 ids each)."""
    target_latency_s: float = Field(default=10.0, gt=0)
    """For ``rowbatch_replica_load``/``rowbatch_desired_replicas``: how long the backlog may
    take to clear (docs/autoscaling.md: 10 s holds a 30 s objective best)."""
    rows_per_s_per_replica: float | None = Field(default=None, gt=0)
    """For the same: what one replica sustains; None: measured while the replica is
    saturated."""
    rate_window_s: float = Field(default=60.0, gt=0)
    """For the same: receive and write rates are means over this span."""
    max_replicas: int | None = Field(default=None, ge=1)
    """For the same: the most replicas worth asking for (what the model servers can feed,
    ``ceil(server rows/s / rows_per_s_per_replica)``); None: no cap."""
    # What ``admin ensure`` creates and checks; the consumer itself does not read these.
    topic: str | None = Field(default=None, pattern=_TOPIC)
    """The topic the subscription reads (``projects/P/topics/T``). ``admin ensure`` needs it;
    the consumer does not."""
    ack_deadline_s: int = Field(default=60, ge=10, le=600)
    """The subscription's ack deadline (Pub/Sub allows 10-600 s). The consumer extends the
    leases of what it holds, so this bounds only how long the messages of a crashed consumer
    wait before Pub/Sub redelivers them."""
    retry_min_backoff_s: float = Field(default=1.0, gt=0, le=600)
    """The subscription's retry policy: a nacked message is redelivered after an exponential
    backoff from this (Pub/Sub allows up to 600 s)..."""
    retry_max_backoff_s: float = Field(default=60.0, ge=0, le=600)
    """...up to this. Short by default: the consumer nacks what it holds when it stops, and
    the other replicas should get it back within seconds."""
    policy_max_delivery_attempts: int | None = Field(default=None, ge=5, le=100)
    """The subscription's dead-letter policy: Pub/Sub moves a message delivered this often
    to ``dead_letter_topic`` (5-100). Default: ``max_delivery_attempts`` + 1 (at least 5),
    so the consumer dead-letters first, with a reason; the policy catches messages that
    kill the consumer before it can."""
    dead_letter_subscription: str | None = Field(default=None, pattern=_SUBSCRIPTION)
    """A subscription on ``dead_letter_topic`` that keeps the dead letters (Pub/Sub drops
    messages published to a topic without subscriptions). Default: the subscription's name
    with ``-dlq`` appended."""

    @model_validator(mode="after")
    def _admin_consistent(self) -> PubSubSettings:
        if self.retry_min_backoff_s > self.retry_max_backoff_s:
            raise ValueError("retry_min_backoff_s must not exceed retry_max_backoff_s")
        if (
            self.policy_max_delivery_attempts is not None
            and self.max_delivery_attempts is not None
            and self.max_delivery_attempts >= self.policy_max_delivery_attempts
        ):
            raise ValueError(
                "max_delivery_attempts must be below policy_max_delivery_attempts (the "
                "consumer dead-letters with a reason before Pub/Sub moves the message)"
            )
        if self.topic is not None and self.topic == self.dead_letter_topic:
            raise ValueError("dead_letter_topic must differ from topic")
        return self

    def dead_letter_policy_attempts(self) -> int:
        """The dead-letter policy's ``max_delivery_attempts`` that ``admin ensure`` sets."""
        if self.policy_max_delivery_attempts is not None:
            return self.policy_max_delivery_attempts
        if self.max_delivery_attempts is None:
            return 5
        return min(100, max(5, self.max_delivery_attempts + 1))

    def dead_letter_subscription_path(self) -> str:
        """The subscription that keeps the dead letters (see ``dead_letter_subscription``)."""
        return self.dead_letter_subscription or f"{self.subscription}-dlq"


class KafkaSettings(Section):
    """An Apache Kafka topic read as a consumer-group member (offsets committed by the
    consumer, per partition, only below records that are written or dead-lettered). See
    ``consumer/sources/kafka/source.py`` for how commits, rebalances, pauses and retries work."""

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
    """How often completed offsets are committed (also on rebalance and shutdown)."""
    revoke_grace_s: float = Field(default=5.0, ge=0)
    """On a rebalance, how long to wait for in-flight records of revoked partitions."""
    session_timeout_ms: int = Field(default=10_000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3_000, ge=100)
    max_poll_interval_ms: int = Field(default=300_000, ge=1000)
    rebalance_timeout_ms: int = Field(default=30_000, ge=1000)
    """Must exceed ``revoke_grace_s`` plus the commit timeout (10 s)."""
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
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """Required with ``SASL_PLAINTEXT``/``SASL_SSL``."""
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    """CA bundle for the brokers' certificates (default: the system's)."""
    ssl_certfile: Path | None = None
    """Client certificate for mutual TLS (with ``ssl_keyfile``)."""
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    client_id: str = "rowbatch-consumer"
    lag_interval_s: float = Field(default=5.0, gt=0)
    """How often per-partition lag is measured and exported."""
    target_latency_s: float = Field(default=20.0, gt=0)
    """For ``rowbatch_desired_replicas``: how long the backlog may take to clear
    (docs/autoscaling.md: 20 s holds a 30 s objective)."""
    rows_per_s_per_replica: float | None = Field(default=None, gt=0)
    """For ``rowbatch_desired_replicas``: what one replica sustains; None: measured while
    the replica is saturated."""
    rate_window_s: float = Field(default=60.0, gt=0)
    """For ``rowbatch_desired_replicas``: the group's write rate is a mean over this span."""
    max_replicas: int | None = Field(default=None, ge=1)
    """For ``rowbatch_desired_replicas``: the most replicas worth asking for (what the model
    servers can feed, ``ceil(server rows/s / rows_per_s_per_replica)``); the topic's partition
    count caps it anyway. None: the partitions alone."""
    # What ``admin ensure`` creates and checks; the consumer itself does not read these.
    partitions: int = Field(default=6, ge=1)
    """The topic's partition count: also the most consumer replicas that get work (an
    autoscaler's cap)."""
    replication_factor: int = Field(default=3, ge=1, le=32767)
    """Of the topic and its dead-letter topic (1 on a single-broker cluster)."""
    retention_ms: int = Field(default=7 * _DAY_MS, ge=-1)
    """``retention.ms`` of the topic and its dead-letter topic (-1: forever)."""
    dead_letter_partitions: int = Field(default=1, ge=1)
    """The dead-letter topic's partition count (dead letters are few)."""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and (
            self.sasl_mechanism is None
            or not self.sasl_plain_username
            or self.sasl_plain_password is None
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism, "
                f"sasl_plain_username and sasl_plain_password"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError("sasl_mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        if not tls and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            raise ValueError("ssl_* files need security_protocol SSL or SASL_SSL")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")
        if (self.revoke_grace_s + 10) * 1000 >= self.rebalance_timeout_ms:
            raise ValueError("rebalance_timeout_ms must exceed (revoke_grace_s + 10 s)")
        if self.dead_letter_topic == self.topic:
            raise ValueError("dead_letter_topic must differ from topic")
        return self


SourceSettings = Annotated[PubSubSettings | KafkaSettings, Field(discriminator="kind")]
