"""What the Kafka source is configured with (``KafkaSourceConfig``): brokers, topic, group,
commit/retry/rebalance timings, read-ahead bounds, SASL and TLS; checked when built, and turned
into the options of the two aiokafka clients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.helpers import create_ssl_context

from rowbatch.consumer.sources.base import package_version
from rowbatch.consumer.sources.kafka.errors import KafkaConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@dataclass(frozen=True)
class KafkaSourceConfig:
    """How one ``KafkaSource`` reads its topic. Raises ``KafkaConfigError`` naming what
    cannot work."""

    bootstrap_servers: str
    """``host:port[,host:port...]``."""
    topic: str
    group_id: str
    dead_letter_topic: str | None = None
    """Default: ``<topic>.dlq``. Must exist (checked by ``check``)."""
    max_delivery_attempts: int | None = 5
    """The intake dead-letters a record delivered more often than this (``too-many-attempts``);
    attempts are counted locally (see ``source.py``). None: retry forever."""
    redelivery_backoff_s: float = 1.0
    """Delay before a nacked record is yielded again; doubles with each attempt."""
    redelivery_backoff_max_s: float = 30.0
    commit_interval_s: float = 1.0
    commit_timeout_s: float = 10.0
    revoke_grace_s: float = 5.0
    """How long a revoke waits for the revoked partitions' records already sent to the model
    to settle (those not yet sent are withdrawn from the pipeline at once)."""
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    rebalance_timeout_ms: int = 30_000
    """How long the group waits for members to rejoin in a rebalance (covers our revoke)."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a group without a committed offset starts."""
    max_poll_records: int = 500
    max_buffered_records: int = 2000
    """Records fetched and not yet yielded; fetching pauses above this."""
    max_buffered_rows: int | None = None
    """Rows (``rowbatch-row-count``; a record without one counts as one) fetched and not yet
    yielded; no fetch asks for more than fit, and none is made while the buffer is full.
    None: the pipeline's work bound (``WorkBound.rows``: two target batches per request in
    flight), told by the pipeline when it starts; unbounded in rows before that."""
    max_buffered_bytes: int = 64 * 1024 * 1024
    """What records fetched and not yet yielded may cost (sizes plus the measured per-record
    overhead); fetching pauses above this, or when the pipeline's budget is full."""
    max_partition_fetch_bytes: int = 1024 * 1024
    """Must be at least the topic's ``max.message.bytes``."""
    fetch_max_bytes: int = 16 * 1024 * 1024
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    """Required with ``SASL_PLAINTEXT``/``SASL_SSL``."""
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    """CA bundle for the brokers' certificates (default: the system's)."""
    ssl_certfile: str | None = None
    """Client certificate (mutual TLS), with ``ssl_keyfile``."""
    ssl_keyfile: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    client_id: str = "rowbatch-consumer"
    consumer_version: str = field(default_factory=package_version)
    dead_letter_timeout_s: float = 30.0
    check_timeout_s: float = 10.0
    lag_interval_s: float = 5.0
    target_latency_s: float = 20.0
    """For ``rowbatch_desired_replicas``: how long a backlog may take to clear."""
    rows_per_s_per_replica: float | None = None
    """For ``rowbatch_desired_replicas``: what one replica sustains. None: measured."""
    rate_window_s: float = 60.0
    """For ``rowbatch_desired_replicas``: the group's write rate is a mean over this span."""

    def __post_init__(self) -> None:
        for name in ("bootstrap_servers", "topic", "group_id"):
            if not getattr(self, name):
                raise KafkaConfigError(f"Kafka {name} must not be empty")
        if self.dlq_topic == self.topic:
            raise KafkaConfigError(
                f"the dead-letter topic must differ from the topic ({self.topic!r})"
            )
        self._check_numbers()
        self._check_security()

    def _check_numbers(self) -> None:
        if self.max_delivery_attempts is not None and self.max_delivery_attempts < 1:
            raise KafkaConfigError(
                f"max_delivery_attempts must be >= 1 or None, not {self.max_delivery_attempts}"
            )
        for name in (
            "redelivery_backoff_s",
            "redelivery_backoff_max_s",
            "commit_interval_s",
            "commit_timeout_s",
            "dead_letter_timeout_s",
            "check_timeout_s",
            "lag_interval_s",
            "target_latency_s",
            "rate_window_s",
        ):
            if getattr(self, name) <= 0:
                raise KafkaConfigError(f"{name} must be > 0, not {getattr(self, name)}")
        for name in (
            "max_poll_records",
            "max_buffered_records",
            "max_buffered_bytes",
            "max_partition_fetch_bytes",
            "fetch_max_bytes",
        ):
            if getattr(self, name) < 1:
                raise KafkaConfigError(f"{name} must be >= 1, not {getattr(self, name)}")
        if self.max_buffered_rows is not None and self.max_buffered_rows < 1:
            raise KafkaConfigError(
                f"max_buffered_rows must be >= 1 or None, not {self.max_buffered_rows}"
            )
        if self.revoke_grace_s < 0:
            raise KafkaConfigError(f"revoke_grace_s must be >= 0, not {self.revoke_grace_s}")
        if self.rows_per_s_per_replica is not None and self.rows_per_s_per_replica <= 0:
            raise KafkaConfigError(
                f"rows_per_s_per_replica must be > 0 or None, not {self.rows_per_s_per_replica}"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise KafkaConfigError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        revoke_ms = (self.revoke_grace_s + self.commit_timeout_s) * 1000
        if revoke_ms >= self.rebalance_timeout_ms:
            raise KafkaConfigError(
                f"revoke_grace_s + commit_timeout_s ({revoke_ms / 1000:g} s) must be below "
                f"rebalance_timeout_ms ({self.rebalance_timeout_ms} ms), or a revoke would "
                f"get this member expelled from the group"
            )

    def _check_security(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and (
            self.sasl_mechanism is None
            or not self.sasl_plain_username
            or self.sasl_plain_password is None
        ):
            raise KafkaConfigError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism (PLAIN, "
                f"SCRAM-SHA-256 or SCRAM-SHA-512), sasl_plain_username and sasl_plain_password"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise KafkaConfigError(
                f"sasl_mechanism {self.sasl_mechanism} needs security_protocol SASL_PLAINTEXT "
                f"or SASL_SSL, not {self.security_protocol}"
            )
        tls_files = [n for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, n)]
        if tls_files and not self.tls:
            raise KafkaConfigError(
                f"{', '.join(tls_files)} need security_protocol SSL or SASL_SSL, "
                f"not {self.security_protocol}"
            )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise KafkaConfigError("ssl_keyfile needs ssl_certfile")

    @property
    def dlq_topic(self) -> str:
        return self.dead_letter_topic or f"{self.topic}.dlq"

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def client_options(self) -> dict[str, Any]:
        """What both aiokafka clients take: address, identity, security."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol.startswith("SASL_"):
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_plain_username,
                sasl_plain_password=self.sasl_plain_password,
            )
        if self.tls:
            try:
                options["ssl_context"] = create_ssl_context(
                    cafile=self.ssl_cafile,
                    certfile=self.ssl_certfile,
                    keyfile=self.ssl_keyfile,
                    password=self.ssl_key_password,
                )
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                files = {
                    "ssl_cafile": self.ssl_cafile,
                    "ssl_certfile": self.ssl_certfile,
                    "ssl_keyfile": self.ssl_keyfile,
                }
                named = ", ".join(f"{k}={v}" for k, v in files.items() if v) or "system CAs"
                raise KafkaConfigError(f"cannot build the TLS context ({named}): {exc}") from exc
        return options

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


__all__ = ["KafkaSourceConfig", "SaslMechanism", "SecurityProtocol"]
