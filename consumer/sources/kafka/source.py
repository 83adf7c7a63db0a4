"""Apache Kafka behind the ``Source`` protocol, on aiokafka, as a consumer-group member.

How it works (aiokafka 0.14; ``aiokafka/consumer/{consumer,group_coordinator,fetcher}.py``):

* **Fetching.** One background *poll task* calls ``getmany`` in a loop and puts records into a
  local buffer; ``deliveries()`` yields from that buffer. The poll task never waits for the
  pipeline, so the consumer keeps "polling" while the pipeline is busy or paused: aiokafka
  counts ``max_poll_interval_ms`` from the end of the last ``getmany`` (its
  ``fetcher_idle_time``) and leaves the group when it is exceeded; heartbeats are sent by
  aiokafka's own heartbeat task. Membership is therefore lost only if the event loop itself
  is blocked for that long.
* **Backpressure.** ``pause()`` (budget full, or the model server backing off) pauses every
  assigned partition with ``consumer.pause`` and stops yielding; the poll task keeps calling
  ``getmany`` (which then returns nothing after its timeout). The local buffer (and the
  nacked records waiting for a retry) is *read-ahead*, counted at what it really costs (each
  record's key, value and headers plus ``RECORD_OVERHEAD_BYTES`` and
  ``HEADER_OVERHEAD_BYTES`` per header, measured) and bounded by ``max_buffered_records``/
  ``max_buffered_bytes`` and, once the pipeline shares its byte budget with the source
  (``share_budget``), by that budget: the read-ahead is held in it (``ByteBudget.ahead``),
  so what the pipeline holds plus what the source holds stays within one limit, the
  read-ahead takes at most ``READ_AHEAD_SHARE`` (a quarter) of it, and a fetch asks for no
  more records than the room left can hold (at the mean cost seen so far). When a bound is
  reached, partitions are paused the same way until the buffer has drained to half (and the
  read-ahead has half its share of room again). aiokafka drops records it prefetched for a
  paused partition and fetches them again after ``resume`` (its position does not move).
* **Commits** (``enable_auto_commit=False``). Records are settled out of order (batches
  complete out of order; a record may wait for a retry). An :class:`OffsetTracker` keeps the
  unsettled offsets of each partition; the offset committed for a partition is the lowest
  unsettled offset, or one past the highest received when none is (Kafka's committed offset
  is the first record *not* done). Settled means durably written (``ack``) or confirmed in
  the dead-letter topic (``dead_letter``); a record nacked or buffered is not settled, so a
  commit never passes it. Commits run every ``commit_interval_s``, on revoke, and on
  ``close``, serialised by a lock and only when the offset moved.
* **Rebalances** (aiokafka rebalances eagerly: every rebalance revokes *all* partitions and
  assigns afresh). ``on_partitions_revoked``: stop taking records of those partitions (their
  buffered and retry-waiting records are dropped: not settled, so not committed past), wait
  up to ``revoke_grace_s`` for their in-flight records to settle, commit what is
  committable, then forget them. Each assignment of a partition gets a new *epoch*; a record
  from an earlier epoch that settles later is ignored for commits (``ack`` is a no-op, a
  ``dead_letter`` is not published: the partition's next owner, reading from the committed
  offset, processes it again). After a rebalance aiokafka starts each assigned partition
  at its committed offset, so records in flight when it was revoked are read again, by
  this member or another: the same rows are written twice under the same
  ``(chunk_id, row_index)`` key, which the sinks upsert, so the table holds them once.
  ``revoke_grace_s + commit_timeout_s`` must stay below ``rebalance_timeout_ms``.
* **nack = re-deliver locally.** Kafka has no per-record nack: committing past a record
  would lose it, and seeking back would re-read everything after it. So a nacked record stays
  unsettled (the partition's commit waits at it) and is put back in a retry queue, yielded
  again after ``redelivery_backoff_s * 2**(attempt-1)`` (capped by
  ``redelivery_backoff_max_s``) with ``delivery_attempt`` + 1, while the rest of the
  partition keeps flowing. The intake dead-letters a delivery whose attempt exceeds
  ``max_delivery_attempts`` (reason ``too-many-attempts``), which settles it, so a record
  that keeps failing holds the partition's commit for a bounded number of attempts only.
  The attempt count is local: it restarts at 1 when the partition moves to another member
  (or the process restarts). A nack after ``close``, or of a revoked partition's record,
  changes nothing (the next owner reads it again).
* **Dead letters** go to ``dead_letter_topic`` (``<topic>.dlq`` by default) through an
  idempotent producer (``acks=all``): the original key, value and headers plus
  ``rowbatch-dlq-*`` headers (reason, message, source ``topic/partition``, message id
  ``topic/partition/offset``, topic, partition, offset, group, attempt, consumer version,
  time). The record is settled only once the broker confirmed the write; a failed or
  timed-out publish raises :class:`DeadLetterFailed` and leaves it unsettled (the pipeline
  then nacks it). At least once: a publish that timed out may still land, and a record whose
  partition was revoked during the publish is dead-lettered again by its next owner.
  Records whose headers are not UTF-8 (they cannot become ``Delivery.attributes``) are
  dead-lettered by the source itself as ``undecodable`` and never yielded.
* **Lag.** Every ``lag_interval_s`` the source reads the log end offsets and the group's
  committed offsets of *all* partitions of the topic and exports them (see
  ``consumer/observe/lag.py``) in the registry it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, KafkaError
from aiokafka.helpers import create_ssl_context
from prometheus_client import CollectorRegistry

from consumer.observe.lag import LagGauges, ThroughputMeter, desired_replicas, partition_lag
from consumer.sources.base import (
    DeadLetterFailed as BaseDeadLetterFailed,
)
from consumer.sources.base import (
    DeadLetterReason,
    Delivery,
    DeliveryIterator,
    ReasonClass,
    SharedBudget,
    SourceConfigError,
    SourceError,
    SourceUnreachable,
    package_version,
)
from consumer.sources.kafka.causes import ConnectCauses, connect_causes
from consumer.sources.kafka.offsets import OffsetTracker
from wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_GROUP,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_OFFSET,
    ATTR_PARTITION,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
    ATTR_TOPIC,
)
from wire.errors import WireError
from wire.headers import H_ROW_COUNT, kafka_headers_to_attributes

_LOG = logging.getLogger(__name__)

DLQ_MESSAGE_MAX_BYTES = 1024
"""The reason message is cut to this many UTF-8 bytes."""

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_POLL_TIMEOUT_MS = 200
_MIN_POLL_PERIOD_S = 0.05
_CLOSE_TIMEOUT_S = 30.0


class KafkaSourceError(SourceError):
    """Base class for errors raised by ``KafkaSource``."""


class KafkaConfigError(KafkaSourceError, SourceConfigError):
    """The configuration, or the topics it names, cannot work."""


class KafkaUnreachable(KafkaSourceError, SourceUnreachable):
    """The brokers did not answer (or refused the connection/authentication)."""


class KafkaConsumeError(KafkaSourceError):
    """Consuming stopped on an error aiokafka does not recover from (authorization, a record
    larger than the fetch limit, no offset reset policy...)."""


class DeadLetterFailed(KafkaSourceError, BaseDeadLetterFailed):
    """The dead-letter publish to Kafka was not confirmed (see the base class)."""


@dataclass(frozen=True)
class KafkaSourceConfig:
    bootstrap_servers: str
    """``host:port[,host:port...]``."""
    topic: str
    group_id: str
    dead_letter_topic: str | None = None
    """Default: ``<topic>.dlq``. Must exist (checked by ``check``)."""
    max_delivery_attempts: int | None = 5
    """The intake dead-letters a record delivered more often than this (``too-many-attempts``);
    attempts are counted locally (see the module docstring). None: retry forever."""
    redelivery_backoff_s: float = 1.0
    """Delay before a nacked record is yielded again; doubles with each attempt."""
    redelivery_backoff_max_s: float = 30.0
    commit_interval_s: float = 1.0
    commit_timeout_s: float = 10.0
    revoke_grace_s: float = 5.0
    """How long a revoke waits for the revoked partitions' in-flight records to settle."""
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
    target_latency_s: float = 30.0
    """For ``rowbatch_desired_replicas``: how long a backlog may take to clear."""
    rows_per_s_per_replica: float | None = None
    """For ``rowbatch_desired_replicas``: what one replica sustains. None: measured."""

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


@dataclass(eq=False)
class _Held:
    """A record taken from the broker and not yet settled."""

    record: Any
    """``aiokafka.structs.ConsumerRecord``."""
    tp: TopicPartition
    epoch: int
    """The assignment of ``tp`` it was fetched under."""
    size: int
    rows: int
    """From its ``rowbatch-row-count`` header (0 when missing or bad)."""
    cost: int = 0
    """What holding it costs while it is read ahead (``_record_cost``)."""
    attempt: int = 1


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._source._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._source._on_assigned(set(assigned))


def _record_size(record: Any) -> int:
    headers = sum(len(k) + len(v or b"") for k, v in record.headers)
    return len(record.value or b"") + len(record.key or b"") + headers


RECORD_OVERHEAD_BYTES = 800
"""Measured (tests/unit/test_memory_accounting.py): a held record's objects besides its key,
value and header bytes (the ``ConsumerRecord``, its headers list, the ``_Held``, the buffer
and offset-tracker slots)."""
HEADER_OVERHEAD_BYTES = 170
"""Per header: its tuple and the ``str``/``bytes`` objects of its name and value."""


READ_AHEAD_SHARE = 0.25
"""The most of a shared budget the read-ahead may hold; the pipeline keeps the rest."""


def _record_cost(record: Any, size: int) -> int:
    return size + RECORD_OVERHEAD_BYTES + HEADER_OVERHEAD_BYTES * len(record.headers)


def _record_rows(record: Any) -> int:
    for key, value in record.headers:
        if key == H_ROW_COUNT:
            try:
                return max(0, int(bytes(value or b"").decode("ascii")))
            except (UnicodeDecodeError, ValueError):
                return 0
    return 0


class KafkaSource:
    """``Source`` over one Kafka topic, as a member of consumer group ``group_id``.

    Clients are created on first use (``check`` or the first delivery) and closed by
    ``close``. ``registry``: where the lag gauges go (the consumer's metrics registry); a
    private one when not given. ``consumer_factory``/``producer_factory`` replace the aiokafka
    classes (tests). ``on_dead_letter(reason)`` is called after each dead letter the source
    sends on its own initiative is confirmed (the pipeline counts the ones it asks for).
    Everything runs on the event loop's thread."""

    def __init__(
        self,
        config: KafkaSourceConfig,
        *,
        registry: CollectorRegistry | None = None,
        consumer_factory: Callable[..., Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
    ) -> None:
        self.config = config
        self._on_dead_letter = on_dead_letter
        """Called once per dead letter the source sent on its own initiative (records whose
        headers are not UTF-8), after the broker confirmed it; not for ``dead_letter`` calls
        of the pipeline, which counts those itself."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._gauges = LagGauges(self.registry)
        self._meter = ThroughputMeter()
        self._consumer_factory = consumer_factory or AIOKafkaConsumer
        self._producer_factory = producer_factory or AIOKafkaProducer
        self._consumer: Any = None
        self._producer: Any = None
        self._consumer_started = False
        self._producer_started = False
        self._start_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()

        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._epochs: dict[TopicPartition, int] = {}
        """Assigned partitions (including ones being revoked) -> their current epoch."""
        self._fetching: set[TopicPartition] = set()
        """Assigned partitions whose records are taken and yielded (not being revoked)."""
        self._epoch_ids = itertools.count(1)
        self._buffer: deque[_Held] = deque()
        self._buffered_bytes = 0  # what the buffered records cost (``_Held.cost``)
        self._retries: list[tuple[float, int, _Held]] = []
        """Nacked records waiting to be yielded again: (due, seq, held), a heap."""
        self._retry_bytes = 0
        self._budget: SharedBudget | None = None
        """The pipeline's budget, once shared: the read-ahead is held in it."""
        self._retry_seq = itertools.count()
        self._unsettled: dict[Delivery, _Held] = {}
        """Yielded and not yet settled."""
        self._inflight: Counter[tuple[TopicPartition, int]] = Counter()
        """Yielded and not yet settled, per (partition, epoch)."""
        self._committed: dict[TopicPartition, int] = {}
        """What this member last committed per partition, in the current epoch."""

        self._changed = asyncio.Event()
        self._settled = asyncio.Event()
        self._paused = False
        self._fetch_paused = False
        self._closed = False
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._records_seen = 0
        self._rows_seen = 0
        self._cost_seen = 0

        self.assignments = 0
        """Partition assignments received (1 after joining; +1 per rebalance)."""
        self.commits = 0
        """Successful offset commits."""
        self.dead_lettered_here = 0
        """Records the source dead-lettered itself (headers that are not UTF-8)."""

    # -- Source protocol ---------------------------------------------------------------------

    async def check(self) -> None:
        """Start-up check: the brokers answer (``KafkaUnreachable`` naming them, within
        ``check_timeout_s``), the topic and the dead-letter topic exist
        (``KafkaConfigError`` naming the missing ones). Then joins the group. On failure the
        source is closed (its clients stopped): it cannot be used any more."""
        try:
            await self._check()
        except BaseException:
            await self.close()
            raise

    async def _check(self) -> None:
        producer = await self._ensure_producer()
        try:
            async with asyncio.timeout(self.config.check_timeout_s):
                cluster = await producer.client.fetch_all_metadata()
        except (KafkaError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc, "reading topic metadata") from exc
        missing = [
            t
            for t in (self.config.topic, self.config.dlq_topic)
            if not cluster.partitions_for_topic(t)
        ]
        if missing:
            known = sorted(t for t in cluster.topics() if not t.startswith("__"))
            shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            names = " and ".join(repr(t) for t in missing)
            raise KafkaConfigError(
                f"Kafka topic{'s' if len(missing) > 1 else ''} {names} "
                f"do{'' if len(missing) > 1 else 'es'} not exist on "
                f"{self.config.bootstrap_servers} (topics there: {shown or 'none'}); the "
                f"dead-letter topic is source.dead_letter_topic (default '<topic>.dlq')"
            )
        await self._ensure_consumer()

    def deliveries(self) -> DeliveryIterator:
        """Deliveries until ``close`` (then the iteration ends). Joins the group on the first
        ``__anext__`` if ``check`` did not. Raises ``KafkaConsumeError`` if consuming fails
        for good."""
        return DeliveryIterator(self._next_delivery)

    async def ack(self, delivery: Delivery) -> None:
        held = self._take(delivery)
        self._settle_offset(held)

    async def nack(self, delivery: Delivery) -> None:
        """Re-deliver locally after a backoff, with ``delivery_attempt`` + 1; the partition's
        commit waits at this record meanwhile (see the module docstring)."""
        held = self._take(delivery)
        if self._closed or not self._current(held):
            return
        held.attempt += 1
        delay = min(
            self.config.redelivery_backoff_max_s,
            self.config.redelivery_backoff_s * 2 ** (held.attempt - 2),
        )
        due = time.monotonic() + delay
        heapq.heappush(self._retries, (due, next(self._retry_seq), held))
        self._retry_bytes += held.cost
        self._report_ahead()
        self._changed.set()

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """Publish the original key, value and headers plus ``rowbatch-dlq-*`` headers to the
        dead-letter topic, wait for the broker's confirmation, then settle the record. Raises
        ``DeadLetterFailed`` (delivery left unsettled) when the publish is not confirmed in
        time, ``ValueError`` if the delivery is not held. A delivery whose partition was
        revoked meanwhile is dropped without publishing (its next owner handles it)."""
        held = self._unsettled.get(delivery)
        if held is None:
            raise self._not_held(delivery)
        if not self._assigned(held):
            self._take(delivery)
            _LOG.info(
                "not dead-lettering %s: its partition was revoked (the next owner reads it again)",
                delivery.message_id,
            )
            return
        topic = self.config.dlq_topic
        record = held.record
        headers = self.dead_letter_headers(held, delivery, reason)
        try:
            producer = await self._ensure_producer()
            async with asyncio.timeout(self.config.dead_letter_timeout_s):
                sent = await producer.send(
                    topic, value=record.value, key=record.key, headers=headers
                )
                await sent
        except (KafkaError, OSError, TimeoutError, KafkaSourceError) as exc:
            raise DeadLetterFailed(
                f"dead-letter publish of {delivery.message_id} to {topic} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if delivery not in self._unsettled:
            _LOG.warning(
                "%s was dead-lettered to %s but settled meanwhile; not settling it again",
                delivery.message_id,
                topic,
            )
            return
        self._settle_offset(self._take(delivery))

    def pause(self) -> None:
        """Stop yielding and pause fetching of every assigned partition; polling (and so
        group membership) goes on."""
        self._paused = True
        self._update_fetch_pause()

    def resume(self) -> None:
        self._paused = False
        self._update_fetch_pause()
        self._changed.set()

    def share_budget(self, budget: SharedBudget) -> None:
        """Hold the read-ahead in the pipeline's ``budget`` and read ahead only while it has
        room (called by the pipeline when it starts)."""
        self._budget = budget
        budget.watch(self._update_fetch_pause)
        self._report_ahead()
        self._update_fetch_pause()

    @property
    def read_ahead_bytes(self) -> int:
        """What the buffered and retry-waiting records cost."""
        return self._buffered_bytes + self._retry_bytes

    async def close(self) -> None:
        """Stop polling, commit what is committable, leave the group, close the clients.
        Unsettled records are not committed past: the partition's next owner reads them
        again. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        self._settled.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._consumer_started:
            await self._commit(set(self._fetching), "close")
        if self._consumer is not None:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._consumer.stop()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("Kafka consumer did not stop cleanly: %r", exc)
        if self._producer is not None:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._producer.stop()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("Kafka dead-letter producer did not stop cleanly: %r", exc)

    # -- extras ------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def buffered(self) -> int:
        """Fetched and not yet yielded (current partitions only)."""
        return len(self._buffer)

    @property
    def outstanding(self) -> int:
        """Yielded and not yet settled."""
        return len(self._unsettled)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member currently takes records from."""
        return set(self._fetching)

    def committable(self) -> dict[TopicPartition, int]:
        """What a commit now would send, per current partition."""
        out: dict[TopicPartition, int] = {}
        for tp in self._fetching:
            offset = self._tracker.committable(tp)
            if offset is not None:
                out[tp] = offset
        return out

    def exceeded_attempts(self, delivery: Delivery) -> bool:
        limit = self.config.max_delivery_attempts
        return limit is not None and delivery.delivery_attempt > limit

    def dead_letter_headers(
        self, held: _Held, delivery: Delivery, reason: DeadLetterReason
    ) -> list[tuple[str, bytes]]:
        """The original headers (bytes as they were) plus the ``rowbatch-dlq-*`` ones
        (ours replace any of the same name)."""
        message = reason.message.encode("utf-8")[:DLQ_MESSAGE_MAX_BYTES]
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        record = held.record
        ours = {
            ATTR_REASON: reason.reason_class.value,
            ATTR_CODE: reason.code,
            ATTR_MESSAGE: message.decode("utf-8", errors="ignore"),
            ATTR_SOURCE: delivery.source,
            ATTR_MESSAGE_ID: delivery.message_id,
            ATTR_TOPIC: record.topic,
            ATTR_PARTITION: str(record.partition),
            ATTR_OFFSET: str(record.offset),
            ATTR_GROUP: self.config.group_id,
            ATTR_DELIVERY_ATTEMPT: str(delivery.delivery_attempt),
            ATTR_CONSUMER_VERSION: self.config.consumer_version,
            ATTR_TIME: now,
        }
        headers = [(k, bytes(v or b"")) for k, v in record.headers if k not in ours]
        headers += [(k, v.encode("utf-8")) for k, v in ours.items()]
        return headers

    async def refresh_lag(self) -> dict[int, int]:
        """Read end offsets and the group's committed offsets of every partition of the
        topic, update the gauges, and return the lag per partition."""
        consumer = await self._ensure_consumer()
        partitions = consumer.partitions_for_topic(self.config.topic) or set()
        tps = [TopicPartition(self.config.topic, p) for p in sorted(partitions)]
        if not tps:
            return {}
        end = await consumer.end_offsets(tps)
        committed = await asyncio.gather(*(consumer.committed(tp) for tp in tps))
        done = {tp.partition: c for tp, c in zip(tps, committed, strict=True)}
        start: dict[int, int] | None = None
        if self.config.auto_offset_reset == "earliest":
            unknown = [tp for tp in tps if done[tp.partition] is None]
            begin = await consumer.beginning_offsets(unknown) if unknown else {}
            start = {tp.partition: off for tp, off in begin.items()}
        lags = partition_lag({tp.partition: off for tp, off in end.items()}, done, start)
        per_record = self._rows_seen / self._records_seen if self._records_seen else 1.0
        backlog_rows = sum(lags.values()) * per_record
        busy = bool(self._buffer or self._retries or self._unsettled)
        measured = self._meter.sample(time.monotonic(), busy)
        rate = self.config.rows_per_s_per_replica or measured
        desired = (
            desired_replicas(backlog_rows, self.config.target_latency_s, rate, len(tps))
            if rate
            else None
        )
        self._gauges.update(self.config.topic, lags, backlog_rows, rate, desired)
        return lags

    # -- internals: clients and tasks --------------------------------------------------------

    def _unreachable(
        self, exc: BaseException, doing: str, causes: ConnectCauses | None = None
    ) -> KafkaUnreachable:
        reason = (
            f"no answer within {self.config.check_timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else f"{type(exc).__name__}: {exc}"
        )
        return KafkaUnreachable(
            f"cannot reach Kafka at {self.config.bootstrap_servers} ({doing}; "
            f"security_protocol {self.config.security_protocol}): {reason}"
            f"{causes.describe() if causes else ''}"
        )

    async def _ensure_producer(self) -> Any:
        async with self._start_lock:
            if self._closed:
                raise KafkaSourceError("the Kafka source is closed")
            if self._producer is None:
                self._producer = self._producer_factory(**self.config.producer_options())
            if not self._producer_started:
                with connect_causes(self.config.bootstrap_servers) as causes:
                    try:
                        async with asyncio.timeout(self.config.check_timeout_s):
                            await self._producer.start()
                    except (KafkaError, OSError, TimeoutError) as exc:
                        # aiokafka cannot start a client twice: stop it, make a new one later.
                        producer, self._producer = self._producer, None
                        with contextlib.suppress(Exception):
                            await producer.stop()
                        doing = "starting the dead-letter producer"
                        raise self._unreachable(exc, doing, causes) from exc
                self._producer_started = True
            return self._producer

    async def _ensure_consumer(self) -> Any:
        async with self._start_lock:
            if self._closed:
                raise KafkaSourceError("the Kafka source is closed")
            if self._consumer_started:
                return self._consumer
            consumer = self._consumer_factory(**self.config.consumer_options())
            self._consumer = consumer
            consumer.subscribe([self.config.topic], listener=_Listener(self))
            with connect_causes(self.config.bootstrap_servers) as causes:
                try:
                    async with asyncio.timeout(self.config.check_timeout_s):
                        await consumer.start()
                except (KafkaError, OSError, TimeoutError) as exc:
                    self._consumer = None
                    with contextlib.suppress(Exception):
                        await consumer.stop()
                    doing = f"joining group {self.config.group_id!r}"
                    raise self._unreachable(exc, doing, causes) from exc
            self._consumer_started = True
            self._tasks = [
                asyncio.create_task(self._poll_loop(), name="rowbatch-kafka-poll"),
                asyncio.create_task(self._commit_loop(), name="rowbatch-kafka-commit"),
                asyncio.create_task(self._lag_loop(), name="rowbatch-kafka-lag"),
            ]
            _LOG.info(
                "Kafka consumer started: topic %s, group %s, brokers %s",
                self.config.topic,
                self.config.group_id,
                self.config.bootstrap_servers,
            )
            return consumer

    async def _poll_loop(self) -> None:
        consumer = self._consumer
        loop = asyncio.get_running_loop()
        while not self._closed:
            started = loop.time()
            try:
                batches = await consumer.getmany(
                    timeout_ms=_POLL_TIMEOUT_MS, max_records=self._poll_records()
                )
            except ConsumerStoppedError:
                return
            except KafkaError as exc:
                if exc.retriable:
                    _LOG.warning("Kafka fetch failed, retrying: %r", exc)
                    await asyncio.sleep(0.5)
                    continue
                self._fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - reported to the iterator, not lost
                self._fail(exc)
                return
            if self._take_records(batches):
                self._update_fetch_pause()
                self._changed.set()
            elif loop.time() - started < _MIN_POLL_PERIOD_S:
                await asyncio.sleep(_MIN_POLL_PERIOD_S)

    def _poll_records(self) -> int:
        """At most ``max_poll_records``, and no more than the room left (in the budget and
        under ``max_buffered_bytes``) holds at the mean cost of the records seen so far."""
        limit = self.config.max_poll_records
        if not self._records_seen:
            return min(limit, 64) if self._budget is not None else limit
        room = self.config.max_buffered_bytes - self._buffered_bytes
        if self._budget is not None:
            room = min(room, self._budget_room())
        mean = max(1, self._cost_seen // self._records_seen)
        return max(1, min(limit, room // mean))

    def _fail(self, exc: BaseException) -> None:
        _LOG.error("consuming from Kafka topic %s failed: %r", self.config.topic, exc)
        self._error = exc
        self._changed.set()

    async def _commit_loop(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.config.commit_interval_s)
                await self._commit(set(self._fetching), "periodic")
        except Exception as exc:  # noqa: BLE001 - a bug here must stop consuming, not commits
            self._fail(exc)

    async def _lag_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(max(self.config.lag_interval_s, 5.0)):
                    await self.refresh_lag()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.debug("could not measure Kafka lag: %r", exc)
            except Exception:  # noqa: BLE001 - lag is informative; consuming goes on
                _LOG.warning("measuring Kafka lag failed", exc_info=True)
            await asyncio.sleep(self.config.lag_interval_s)

    async def _commit(self, tps: set[TopicPartition], why: str) -> None:
        """Commit the committable offset of each of ``tps`` that moved since the last
        commit. Failures are logged: the offset is committed later, or the partition's next
        owner re-reads from the last commit (never past an unsettled record)."""
        async with self._commit_lock:
            offsets: dict[TopicPartition, int] = {}
            for tp in tps:
                if tp not in self._epochs:
                    continue
                offset = self._tracker.committable(tp)
                if offset is not None and offset > self._committed.get(tp, -1):
                    offsets[tp] = offset
            if not offsets:
                return
            try:
                async with asyncio.timeout(self.config.commit_timeout_s):
                    await self._consumer.commit(offsets)
            except CommitFailedError as exc:
                _LOG.warning("%s commit refused (group rebalanced): %s", why, exc)
                return
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("%s commit of %s failed: %r", why, _show(offsets), exc)
                return
            self._committed.update(offsets)
            self.commits += 1
            _LOG.debug("%s commit: %s", why, _show(offsets))

    # -- internals: rebalance ----------------------------------------------------------------

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        tps = {tp for tp in revoked if tp in self._epochs}
        if not tps:
            return
        try:
            self._fetching -= tps
            self._purge(tps)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.revoke_grace_s

            def inflight() -> int:
                return sum(self._inflight[(tp, self._epochs[tp])] for tp in tps)

            while (left := inflight()) and not self._closed:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    _LOG.warning(
                        "revoke: %d record(s) of %s still in flight after %g s; not "
                        "committing past them (the next owner reads them again)",
                        left,
                        _show_tps(tps),
                        self.config.revoke_grace_s,
                    )
                    break
                self._settled.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._settled.wait()
            await self._commit(tps, "revoke")
        finally:
            for tp in tps:
                epoch = self._epochs.pop(tp)
                self._inflight.pop((tp, epoch), None)
                self._tracker.forget(tp)
                self._committed.pop(tp, None)
            _LOG.info("revoked %s", _show_tps(tps))

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        mine = {tp for tp in assigned if tp.topic == self.config.topic}
        for tp in mine:
            self._epochs[tp] = next(self._epoch_ids)
            self._fetching.add(tp)
        if self._fetch_paused and mine and self._consumer is not None:
            self._consumer.pause(*mine)
        self.assignments += 1
        _LOG.info("assigned %s", _show_tps(mine))

    def _purge(self, tps: set[TopicPartition]) -> None:
        """Drop buffered and retry-waiting records of ``tps`` (never yielded again)."""
        kept = deque(h for h in self._buffer if h.tp not in tps)
        self._buffered_bytes = sum(h.cost for h in kept)
        self._buffer = kept
        self._retries = [r for r in self._retries if r[2].tp not in tps]
        heapq.heapify(self._retries)
        self._retry_bytes = sum(r[2].cost for r in self._retries)
        self._report_ahead()
        self._update_fetch_pause()

    # -- internals: records and deliveries ---------------------------------------------------

    def _take_records(self, batches: Mapping[TopicPartition, list[Any]]) -> int:
        added = 0
        for tp, records in batches.items():
            if tp not in self._fetching:
                continue  # revoked while the fetch was on its way
            epoch = self._epochs[tp]
            last = self._tracker.last_received(tp)
            for record in records:
                if last is not None and record.offset <= last:
                    continue  # fetched twice (aiokafka re-fetch after a pause): have it
                self._tracker.received(tp, record.offset)
                last = record.offset
                size = _record_size(record)
                held = _Held(
                    record, tp, epoch, size, _record_rows(record), _record_cost(record, size)
                )
                self._records_seen += 1
                self._rows_seen += held.rows
                self._cost_seen += held.cost
                self._buffer.append(held)
                self._buffered_bytes += held.cost
                added += 1
        if added:
            self._report_ahead()
        return added

    def _budget_room(self) -> int:
        """Room for read-ahead in the shared budget: what is left of it, and no more than
        ``READ_AHEAD_SHARE`` of it in all (the pipeline keeps the rest)."""
        budget = self._budget
        assert budget is not None
        share = budget.limit * READ_AHEAD_SHARE - self.read_ahead_bytes
        return min(budget.room, int(share))

    def _report_ahead(self) -> None:
        if self._budget is not None:
            self._budget.set_ahead(self._buffered_bytes + self._retry_bytes)

    def _assigned(self, held: _Held) -> bool:
        """Fetched under the current assignment of its partition (which may be being
        revoked: its settles still count until the revoke's commit)."""
        return self._epochs.get(held.tp) == held.epoch

    def _current(self, held: _Held) -> bool:
        """Assigned, and its partition not being revoked: may be yielded (again)."""
        return held.tp in self._fetching and self._assigned(held)

    def _update_fetch_pause(self) -> None:
        """Pause fetching while paused by the pipeline or while the buffer is full; resume
        once neither holds and the buffer has drained to half."""
        cfg = self.config
        budget = self._budget
        if self._paused:
            want = True
        elif self._fetch_paused:
            want = not (
                len(self._buffer) <= cfg.max_buffered_records // 2
                and self._buffered_bytes <= cfg.max_buffered_bytes // 2
                and (budget is None or self._budget_room() > budget.limit * READ_AHEAD_SHARE / 2)
            )
        else:
            want = (
                len(self._buffer) >= cfg.max_buffered_records
                or self._buffered_bytes >= cfg.max_buffered_bytes
                or (budget is not None and self._budget_room() <= 0)
            )
        if want == self._fetch_paused:
            return
        self._fetch_paused = want
        consumer = self._consumer
        if consumer is None or not self._consumer_started:
            return
        if want:
            consumer.pause(*consumer.assignment())
        else:
            consumer.resume(*consumer.paused())

    async def _next_delivery(self) -> Delivery:
        if not self._closed:
            await self._ensure_consumer()
        while True:
            if self._error is not None:
                raise KafkaConsumeError(
                    f"consuming Kafka topic {self.config.topic} "
                    f"({self.config.bootstrap_servers}) failed: {self._error!r}"
                ) from self._error
            if self._closed:
                raise StopAsyncIteration
            now = time.monotonic()
            if not self._paused:
                held = self._pop_ready(now)
                if held is not None:
                    delivery = await self._deliver(held)
                    if delivery is not None:
                        return delivery
                    continue
            self._changed.clear()
            timeout: float | None = None
            if not self._paused and self._retries:
                timeout = max(0.0, self._retries[0][0] - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def _pop_ready(self, now: float) -> _Held | None:
        while self._retries and self._retries[0][0] <= now:
            held = heapq.heappop(self._retries)[2]
            self._retry_bytes -= held.cost
            self._report_ahead()
            if self._current(held):
                return held
        while self._buffer:
            held = self._buffer.popleft()
            self._buffered_bytes -= held.cost
            self._report_ahead()
            self._update_fetch_pause()
            if self._current(held):
                return held
        return None

    async def _deliver(self, held: _Held) -> Delivery | None:
        record = held.record
        tp = held.tp
        try:
            attributes = kafka_headers_to_attributes(record.headers)
            bad: WireError | None = None
        except WireError as exc:
            attributes, bad = {}, exc
        timestamp = record.timestamp
        delivery = Delivery(
            message_id=f"{tp.topic}/{tp.partition}/{record.offset}",
            payload=bytes(record.value or b""),
            attributes=attributes,
            publish_time=timestamp / 1000
            if timestamp is not None and timestamp >= 0
            else time.time(),
            delivery_attempt=held.attempt,
            source=f"{tp.topic}/{tp.partition}",
            ordering_key=bytes(record.key or b"").decode("utf-8", errors="replace"),
            size=held.size,
        )
        self._unsettled[delivery] = held
        self._inflight[(tp, held.epoch)] += 1
        if bad is None:
            return delivery
        reason = DeadLetterReason(ReasonClass.UNDECODABLE, f"{bad.reason}: {bad}", code=bad.reason)
        try:
            await self.dead_letter(delivery, reason)
        except DeadLetterFailed:
            _LOG.exception("dead-letter publish failed for %s; retrying later", delivery.message_id)
            await self.nack(delivery)
            return None
        self.dead_lettered_here += 1
        _LOG.warning("dead-lettered %s: undecodable headers: %s", delivery.message_id, bad)
        if self._on_dead_letter is not None:
            try:
                self._on_dead_letter(reason)
            except Exception:  # noqa: BLE001 - a metrics hook must not stop consumption
                _LOG.exception("on_dead_letter hook failed for %s", delivery.message_id)
        return None

    def _take(self, delivery: Delivery) -> _Held:
        held = self._unsettled.pop(delivery, None)
        if held is None:
            raise self._not_held(delivery)
        key = (held.tp, held.epoch)
        if self._inflight[key] <= 1:
            self._inflight.pop(key, None)
        else:
            self._inflight[key] -= 1
        self._settled.set()
        return held

    def _settle_offset(self, held: _Held) -> None:
        if not self._assigned(held):
            return  # an earlier assignment's record: its next owner reads it again
        if self._tracker.settled(held.tp, held.record.offset):
            self._meter.done(held.rows)

    def _not_held(self, delivery: Delivery) -> ValueError:
        return ValueError(
            f"record {delivery.message_id} is not held by this source (already settled, or "
            f"delivered by another source)"
        )


def _show(offsets: Mapping[TopicPartition, int]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}@{o}" for tp, o in sorted(offsets.items()))


def _show_tps(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(tps)) or "nothing"


__all__ = [
    "DeadLetterFailed",
    "KafkaConfigError",
    "KafkaConsumeError",
    "KafkaSource",
    "KafkaSourceConfig",
    "KafkaSourceError",
    "KafkaUnreachable",
]
